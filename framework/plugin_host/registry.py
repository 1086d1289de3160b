"""Loads plugins through entry points and keeps the named policies of each group.

Built-in policies arrive exactly as a third party's do: through the `nanoserve` entry-point
group and the `register_*` hooks. Each registered policy's config dataclass is stored in
Hydra's ConfigStore under its group, so `scheduler=NAME scheduler.FIELD=...` composes,
validates and sweeps without any YAML.

Every policy remembers its provider (the entry point and the distribution declaring it), so
that each error a user can hit names the package to look at: an unknown policy name lists
what each installed package provides, a plugin that fails to import is reported with its
distribution while the others still load, and two plugins claiming one name are both named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.api import hookspecs
from framework.api.groups import GROUPS
from framework.api.policy import API_VERSION, PolicyConfig
from framework.plugin_host.compat import v1_problem

_HOOK_OF_GROUP = {
    "scheduler": "register_schedulers",
    "allocator": "register_allocators",
    "preemption": "register_preemptions",
    "output": "register_outputs",
    "router": "register_routers",
}

API_ATTRIBUTE = "NANOSERVE_API"
"""A plugin module may declare the policy API version it was written for; a mismatch is a
load error (reported, the plugin skipped) rather than a confusing failure mid-run."""


class PluginError(ValueError):
    """A plugin registered something invalid: a name twice, or a class of the wrong kind."""


class UnknownPolicyError(ValueError):
    """A config names a policy that no loaded plugin registered."""


@dataclass(frozen=True)
class Provider:
    """Who registered a policy: the pluggy plugin name (the entry point's name) and, when it
    came from an installed package, that package's distribution name."""

    plugin: str
    distribution: str | None = None

    @property
    def label(self) -> str:
        """Short form for listings: the distribution, else the plugin."""
        return self.distribution or f"plugin {self.plugin}"

    def __str__(self) -> str:
        where = f"distribution {self.distribution}" if self.distribution else "not installed"
        return f"plugin {self.plugin!r} ({where})"


@dataclass(frozen=True)
class Entry:
    group: str
    name: str
    cls: type
    config_cls: type[PolicyConfig]
    provider: Provider


@dataclass(frozen=True)
class LoadError:
    """An entry point that could not be loaded; its plugin's policies are unavailable."""

    plugin: str  # the entry point's name
    target: str  # what it points at, e.g. "my_package.sjf"
    distribution: str
    error: str

    def __str__(self) -> str:
        return (
            f"nanoserve: plugin {self.plugin!r} ({self.target}) from distribution "
            f"{self.distribution} failed to load: {self.error}. Its policies are unavailable; "
            f"the other plugins loaded."
        )


@dataclass
class LoadedPlugins:
    pm: pluggy.PluginManager
    distributions: dict[str, str]  # plugin name -> distribution name
    errors: list[LoadError]


def load_plugins(group: str = hookspecs.PROJECT) -> LoadedPlugins:
    """A PluginManager with every installed entry point of `group` registered.

    A plugin that fails to import (or declares another policy API version) is recorded with
    its distribution and error, and skipped: one broken package never takes the tool down.
    A module written for API 1 that uses nothing API 2 renamed loads as it is.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    distributions: dict[str, str] = {}
    errors: list[LoadError] = []
    for ep in metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party plugin must not stop the others
            errors.append(LoadError(ep.name, ep.value, dist, f"{type(exc).__name__}: {exc}"))
            continue
        wanted = getattr(plugin, API_ATTRIBUTE, API_VERSION)
        why = None
        if wanted == 1:
            why = v1_problem(plugin)
        elif wanted != API_VERSION:
            why = (
                f"it is written for policy API {wanted}; this nanoserve provides API {API_VERSION}"
            )
        if why is not None:
            errors.append(LoadError(ep.name, ep.value, dist, why))
            continue
        if pm.is_registered(plugin):  # the same module reached through two paths
            continue
        # Entry-point names are unique only within a distribution.
        name = ep.name if pm.get_plugin(ep.name) is None else f"{dist}:{ep.name}"
        pm.register(plugin, name=name)
        distributions[name] = dist
    return LoadedPlugins(pm, distributions, errors)


class Registry:
    """The policies and observers that the plugins in `pm` register, with their providers."""

    def __init__(
        self,
        pm: pluggy.PluginManager,
        distributions: Mapping[str, str] | None = None,
        load_errors: Iterable[LoadError] = (),
    ) -> None:
        self.pm = pm
        self.distributions = dict(distributions or {})
        self.load_errors = list(load_errors)
        self.policies: dict[str, dict[str, Entry]] = {g: {} for g in GROUPS}
        self.observers: dict[str, tuple[Any, Provider]] = {}
        self._collected: set[int] = set()

    @classmethod
    def from_entry_points(cls, group: str = hookspecs.PROJECT) -> Registry:
        loaded = load_plugins(group)
        reg = cls(loaded.pm, loaded.distributions, loaded.errors)
        reg.collect()
        return reg

    # ---- registration ------------------------------------------------------------------
    def collect(self) -> None:
        """Call every registered plugin's `register_*` hooks, in registration order."""
        for name, plugin in self.pm.list_name_plugin():
            if plugin is not None and id(plugin) not in self._collected:
                self._collect_plugin(name, plugin)

    def add_plugin(self, plugin: Any, name: str, distribution: str | None = None) -> None:
        """Register one more plugin object (a module, say) and collect its policies."""
        self.pm.register(plugin, name=name)
        if distribution:
            self.distributions[name] = distribution
        self._collect_plugin(name, plugin)

    def provider(self, plugin_name: str) -> Provider:
        return Provider(plugin_name, self.distributions.get(plugin_name))

    def _collect_plugin(self, name: str, plugin: Any) -> None:
        self._collected.add(id(plugin))
        provider = self.provider(name)
        hooks = [(g, h, self._registrar(g, provider)) for g, h in _HOOK_OF_GROUP.items()]
        hooks.append(("observer", "register_observers", self._observer_registrar(provider)))
        for _, hook_name, register in hooks:
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    impl.function(register=register)
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(f"{provider}: {hook_name} failed: {exc!r}") from exc

    def _registrar(self, group: str, provider: Provider) -> Any:
        def register(name: str, cls: type, config_cls: type[PolicyConfig] = PolicyConfig) -> None:
            base = GROUPS[group]
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise PluginError(f"{provider}: {group} {name!r} must subclass {base.__name__}")
            if not (
                isinstance(config_cls, type)
                and dataclasses.is_dataclass(config_cls)
                and issubclass(config_cls, PolicyConfig)
            ):
                raise PluginError(
                    f"{provider}: {group} {name!r} config must be a PolicyConfig dataclass"
                )
            if name in self.policies[group]:
                other = self.policies[group][name].provider
                raise PluginError(
                    f"{group} {name!r} is registered twice: by {other} and by {provider}; "
                    f"uninstall one of them or rename the policy in one"
                )
            self.policies[group][name] = Entry(group, name, cls, config_cls, provider)

        return register

    def _observer_registrar(self, provider: Provider) -> Any:
        def register(name: str, factory: Any) -> None:
            if name in self.observers:
                raise PluginError(
                    f"observer {name!r} is registered twice: "
                    f"by {self.observers[name][1]} and by {provider}"
                )
            self.observers[name] = (factory, provider)

        return register

    # ---- lookup ------------------------------------------------------------------------
    def choices(self, group: str) -> str:
        """`name (distribution)` for each policy of `group`, sorted by name."""
        entries = self.policies[group]
        return ", ".join(f"{n} ({e.provider.label})" for n, e in sorted(entries.items()))

    def describe(self) -> str:
        """Every group's policies with their providers, plus any plugin that failed to load
        (a likely reason for a missing name)."""
        width = max(map(len, self.policies)) + 1
        lines = [f"  {g + ':':<{width}} {self.choices(g)}" for g in self.policies]
        if self.load_errors:
            lines.append("Plugins that failed to load:")
            lines += [
                f"  {e.plugin} (distribution {e.distribution}): {e.error}" for e in self.load_errors
            ]
        return "\n".join(lines)

    def unknown_message(self, unknown: Iterable[tuple[str, str]]) -> str:
        wrong = ", ".join(f"{g}={n}" for g, n in unknown)
        return (
            f"unknown policy: {wrong}\n"
            f"Available policies per group, as name (distribution providing it):\n"
            f"{self.describe()}"
        )

    def unknown_line(self, unknown: Iterable[tuple[str, str]]) -> str:
        """The same on one line, for the command line: each unknown name and what its group
        offers (`python run.py --help` lists every group)."""
        unknown = list(unknown)
        wrong = ", ".join(f"{g}={n}" for g, n in unknown)
        groups = dict.fromkeys(g for g, _ in unknown)
        offers = "; ".join(f"{g} offers {self.choices(g) or 'nothing'}" for g in groups)
        failed = (
            f" ({len(self.load_errors)} plugin(s) failed to load, listed above)"
            if self.load_errors
            else ""
        )
        return f"unknown policy {wrong}; {offers}{failed}"

    def get(self, group: str, name: str) -> Entry:
        if group not in self.policies:
            raise ValueError(f"unknown policy group {group!r}; groups: {', '.join(self.policies)}")
        if name not in self.policies[group]:
            raise UnknownPolicyError(self.unknown_message([(group, name)]))
        return self.policies[group][name]

    def build(self, group: str, cfg: Any) -> Any:
        """Instantiate the policy that `cfg.name` names, with its typed config.

        The config goes through the policy's dataclass again, so a config that did not come
        through Hydra (or a `+scheduler.x=` override Hydra let through) is checked the same
        way, and every error names `group.field`.
        """
        entry = self.get(group, cfg["name"])
        fields = [f.name for f in dataclasses.fields(entry.config_cls)]
        unknown = [k for k in cfg if k not in fields]
        if unknown:
            raise ValueError(
                f"{group}.{unknown[0]} is not an option of {group} {entry.name!r} "
                f"({entry.provider.label}); its options are: {', '.join(fields)}"
            )
        try:
            typed = OmegaConf.to_object(
                OmegaConf.merge(OmegaConf.structured(entry.config_cls), cfg)
            )
        except OmegaConfBaseException as exc:
            first_line = str(exc).splitlines()[0]
            raise ValueError(f"{group}.{exc.full_key}: {first_line}") from exc
        return entry.cls(typed)

    def store_configs(self, cs: ConfigStore) -> None:
        for group, entries in self.policies.items():
            for name, entry in entries.items():
                cs.store(
                    group=group,
                    name=name,
                    node=entry.config_cls(name=name),
                    provider=entry.provider.label,
                )


_REGISTRY: Registry | None = None


def registry() -> Registry:
    """The process-wide registry (plugins load once; Hydra multiruns reuse it)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry.from_entry_points()
    return _REGISTRY
