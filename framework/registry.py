"""Loads plugins through entry points and keeps the named policies of each group.

Built-in policies arrive exactly as a third party's do: through the `nanoserve` entry-point
group and the `register_*` hooks. Each registered policy's config dataclass is stored in
Hydra's ConfigStore under its group, so `scheduler=NAME scheduler.FIELD=...` composes,
validates and sweeps without any YAML.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy
from hydra.core.config_store import ConfigStore

from framework import hookspecs
from framework.policy import GROUPS, PolicyConfig

log = logging.getLogger(__name__)

_HOOK_OF_GROUP = {
    "scheduler": "register_schedulers",
    "allocator": "register_allocators",
    "preemption": "register_preemptions",
    "output": "register_outputs",
}


@dataclass(frozen=True)
class Entry:
    group: str
    name: str
    cls: type
    config_cls: type[PolicyConfig]
    provider: str  # the plugin (entry point / distribution) that registered it


class Registry:
    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.policies: dict[str, dict[str, Entry]] = {g: {} for g in GROUPS}
        self.observers: dict[str, tuple[Any, str]] = {}
        self.load_errors: list[str] = []

    def collect(self) -> None:
        for group, hook_name in _HOOK_OF_GROUP.items():
            hook = getattr(self.pm.hook, hook_name)
            for impl in hook.get_hookimpls():
                provider = self.pm.get_name(impl.plugin) or repr(impl.plugin)
                impl.function(register=self._registrar(group, provider))
        for impl in self.pm.hook.register_observers.get_hookimpls():
            provider = self.pm.get_name(impl.plugin) or repr(impl.plugin)
            impl.function(register=self._observer_registrar(provider))

    def _registrar(self, group: str, provider: str) -> Any:
        def register(name: str, cls: type, config_cls: type[PolicyConfig] = PolicyConfig) -> None:
            base = GROUPS[group]
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise TypeError(
                    f"plugin {provider}: {group} {name!r} must subclass {base.__name__}"
                )
            if not (dataclasses.is_dataclass(config_cls) and issubclass(config_cls, PolicyConfig)):
                raise TypeError(
                    f"plugin {provider}: {group} {name!r} config must be a PolicyConfig dataclass"
                )
            if name in self.policies[group]:
                other = self.policies[group][name].provider
                raise ValueError(f"{group} {name!r} is registered twice: by {other} and {provider}")
            self.policies[group][name] = Entry(group, name, cls, config_cls, provider)

        return register

    def _observer_registrar(self, provider: str) -> Any:
        def register(name: str, factory: Any) -> None:
            if name in self.observers:
                raise ValueError(
                    f"observer {name!r} is registered twice: "
                    f"by {self.observers[name][1]} and {provider}"
                )
            self.observers[name] = (factory, provider)

        return register

    def get(self, group: str, name: str) -> Entry:
        if group not in self.policies:
            raise ValueError(f"unknown policy group {group!r}; groups: {', '.join(self.policies)}")
        entries = self.policies[group]
        if name not in entries:
            choices = ", ".join(f"{n} (from {e.provider})" for n, e in sorted(entries.items()))
            raise ValueError(f"{group}={name!r} is not registered; available: {choices}")
        return entries[name]

    def build(self, group: str, cfg: Any) -> Any:
        """Instantiate the policy that `cfg.name` names, with its typed config."""
        entry = self.get(group, cfg.name)
        fields = {f.name for f in dataclasses.fields(entry.config_cls)}
        values = {k: v for k, v in dict(cfg).items() if k in fields}
        return entry.cls(entry.config_cls(**values))

    def store_configs(self, cs: ConfigStore) -> None:
        for group, entries in self.policies.items():
            for name, entry in entries.items():
                cs.store(group=group, name=name, node=entry.config_cls(name=name))


def plugin_manager() -> pluggy.PluginManager:
    """A PluginManager with every installed `nanoserve` entry point loaded.

    A plugin that fails to import is reported with its distribution and error; the others
    still load, so one broken package never takes the whole tool down.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    errors: list[str] = []
    for ep in metadata.entry_points(group=hookspecs.PROJECT):
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party plugin must not stop the others
            dist = ep.dist.name if ep.dist else "?"
            msg = f"plugin {ep.name} ({ep.value}, distribution {dist}) failed to load: {exc!r}"
            log.error(msg)
            errors.append(msg)
            continue
        pm.register(plugin, name=ep.name)
    pm.load_errors = errors  # type: ignore[attr-defined]
    return pm


_REGISTRY: Registry | None = None


def registry() -> Registry:
    """The process-wide registry (plugins load once; Hydra multiruns reuse it)."""
    global _REGISTRY
    if _REGISTRY is None:
        pm = plugin_manager()
        reg = Registry(pm)
        reg.load_errors = list(getattr(pm, "load_errors", []))
        reg.collect()
        _REGISTRY = reg
    return _REGISTRY
