"""pluggy hook specifications: how plugins register policies and observe runs.

In the style of simonw/llm's `register_models(register)`: a plugin module implements
`register_schedulers(register)` and calls `register(name, cls, config_cls)`. Observer hooks
follow pytest's `pytest_*` style: implement only those you need.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "nanoserve"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_schedulers(register: Any) -> None:
    """Call `register(name, SchedulerClass, ConfigDataclass)` for each scheduler."""


@hookspec
def register_allocators(register: Any) -> None:
    """Call `register(name, AllocatorClass, ConfigDataclass)` for each allocator."""


@hookspec
def register_preemptions(register: Any) -> None:
    """Call `register(name, PreemptionClass, ConfigDataclass)` for each preemption policy."""


@hookspec
def register_outputs(register: Any) -> None:
    """Call `register(name, OutputPolicyClass, ConfigDataclass)` for each output policy."""


@hookspec
def register_routers(register: Any) -> None:
    """Call `register(name, RouterClass, ConfigDataclass)` for each router (a cluster's
    fifth policy group: `framework.api.router`)."""


@hookspec
def register_observers(register: Any) -> None:
    """Call `register(name, factory)`; `factory(run_config)` returns an object whose
    methods implement the observer hooks below. Enabled per run by `observers=[...]`."""


@hookspec
def on_run_start(run: Any) -> None:
    """A run begins: `run` is the `RunInfo` (config, output folder, workload size)."""


@hookspec
def on_step_end(stats: Any) -> None:
    """An engine step ended: `stats` is its `StepStats` (counts and phase times)."""


@hookspec
def on_request_finished(request: Any) -> None:
    """A request got its last token (stamped then, not at release): its `Sequence`."""


@hookspec
def on_run_end(run: Any, summary: dict[str, Any]) -> None:
    """A run ended, with the summary that `metrics.json` holds."""


@hookspec
def on_run_abort(run: Any, error: BaseException, summary: dict[str, Any]) -> None:
    """A run stopped early (an exception, a broken invariant, Ctrl-C), after its partial
    results were written; `summary` is what was measured so far, marked incomplete."""
