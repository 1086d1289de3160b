"""Names the plugin when an observer raises inside a hook.

Observers are called through pluggy (`registry().pm.hook`), which re-raises an observer's
exception as if the engine had raised it: the traceback ends in someone else's package and
nothing says which plugin to look at. `GuardedHooks` stands in for the hook relay wherever
the engine and `serve` call hooks, lets pluggy call the implementations exactly as before
(order, wrappers, `tryfirst`), and re-raises a crash as

    HookError: observer plugin 'observer:bad' (my-dist) raised in on_step_end: ValueError(...)

The culprit is found from the traceback: the outermost frame that runs one of the hook's
implementations. Ctrl-C (`KeyboardInterrupt`) and other `BaseException`s pass through
untouched, so `serve` can tell an interruption from a crash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import CodeType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.plugin_host.registry import Registry

OBSERVER_PREFIX = "observer:"  # how `run_with_observers` names the observers it registers


class HookError(RuntimeError):
    """A plugin raised inside a hook; `plugin` is its registered name (None if unknown)."""

    def __init__(self, message: str, hook: str, plugin: str | None) -> None:
        super().__init__(message)
        self.hook = hook
        self.plugin = plugin


def plugin_label(reg: Registry, name: str) -> str:
    """`observer plugin 'observer:x' (dist)` or `plugin 'x' (dist)`: who to blame, and the
    package it came from when known."""
    dist: str | None = reg.distributions.get(name)
    if name.startswith(OBSERVER_PREFIX):
        entry = reg.observers.get(name[len(OBSERVER_PREFIX) :])
        dist = entry[1].label if entry is not None else dist
        kind = "observer plugin"
    else:
        kind = "plugin"
    return f"{kind} {name!r}" + (f" ({dist})" if dist else "")


def _codes(function: Any) -> list[CodeType]:
    """The code objects a hook implementation may run under: its own, and those of the
    functions it wraps (`functools.wraps` chains), so a decorated implementation is found."""
    codes: list[CodeType] = []
    for _ in range(16):  # a __wrapped__ chain is short; never loop on a cyclic one
        code = getattr(function, "__code__", None)
        if code is not None:
            codes.append(code)
        function = getattr(function, "__wrapped__", None)
        if function is None:
            break
    return codes


def culprit(tb: TracebackType | None, impls: list[Any]) -> Any | None:
    """The hook implementation (pluggy `HookImpl`) whose frame is outermost in `tb`.

    Two implementations may share a code object (two instances of one observer class);
    the frame's `self` then tells them apart.
    """
    by_code: dict[CodeType, list[Any]] = {}
    for impl in impls:
        for code in _codes(impl.function):
            by_code.setdefault(code, []).append(impl)
    while tb is not None:
        candidates = by_code.get(tb.tb_frame.f_code)
        if candidates:
            me = tb.tb_frame.f_locals.get("self")
            return next((i for i in candidates if i.plugin is me), candidates[0])
        tb = tb.tb_next
    return None


class GuardedHooks:
    """A hook relay whose every call names the plugin that raised (see the module doc).

    `label(plugin_name)` describes a plugin for the message; by default, its name.
    """

    def __init__(self, relay: Any, label: Callable[[str], str] | None = None) -> None:
        self._relay = relay
        self._label = label or (lambda name: f"plugin {name!r}")

    def __getattr__(self, hook: str) -> Callable[..., Any]:
        caller = getattr(self._relay, hook)

        def call(**kwargs: Any) -> Any:
            try:
                return caller(**kwargs)
            except HookError:
                raise  # a hook called from inside a hook: already named
            except Exception as exc:
                raise self._error(hook, caller, exc) from exc

        # pluggy keeps one caller per hook (plugins registered later join it): build the
        # guard once, so the engine's per-step calls skip this lookup.
        setattr(self, hook, call)
        return call

    def _error(self, hook: str, caller: Any, exc: Exception) -> HookError:
        get_impls = getattr(caller, "get_hookimpls", None)
        impls = list(get_impls()) if get_impls is not None else []
        impl = culprit(exc.__traceback__, impls)
        if impl is not None:
            who = self._label(impl.plugin_name)
            return HookError(f"{who} raised in {hook}: {exc!r}", hook, impl.plugin_name)
        names = ", ".join(self._label(i.plugin_name) for i in impls) or "none"
        return HookError(
            f"a plugin raised in {hook} (implemented by: {names}): {exc!r}", hook, None
        )


def guard_hooks(hooks: Any, reg: Registry) -> GuardedHooks:
    """`hooks`, guarded once (a relay already guarded is returned as it is)."""
    if isinstance(hooks, GuardedHooks):
        return hooks
    return GuardedHooks(hooks, functools.partial(plugin_label, reg))
