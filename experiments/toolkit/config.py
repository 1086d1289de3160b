"""One way to compose a run config for a tool: the same Hydra configs `python run.py` reads,
with the tool's overrides, composed once per distinct override list."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from experiments.toolkit.paths import CONF
from framework.run.config import register_configs

Combo = tuple[str, str, str]  # scheduler, allocator, output
# The policy the others are measured against (outputs, capacity).
REFERENCE: Combo = ("continuous", "incremental", "immediate")
# Under a timing tool's overrides: invariant checks are host work that a serving engine would
# not do on every step.
TIMED = ["engine.check_invariants=false"]


def compose_cfg(overrides: list[str]) -> DictConfig:
    """The run config of `overrides`. Composed configs are cached and shared: derive another
    by composing other overrides, never by assigning to a returned one."""
    return _composed(tuple(overrides))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    """Composed once per distinct override list (Hydra takes a good part of a second)."""
    register_configs()
    with _apart_from_running_app(), initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        return compose(config_name="config", overrides=list(overrides))


@contextlib.contextmanager
def _apart_from_running_app() -> Iterator[None]:
    """Inside a Hydra app (a sweep's callback composing its jobs' configs again), Hydra's
    global state is the app's: set aside while composing, then given back."""
    state = GlobalHydra.instance()
    app = state.hydra if state.is_initialized() else None
    state.clear()
    try:
        yield
    finally:
        state.clear()
        if app is not None:
            state.initialize(app)


def combo_overrides(overrides: list[str], combo: Combo) -> list[str]:
    """`overrides` with one scheduler x allocator x output policy."""
    scheduler, allocator, output = combo
    return [*overrides, f"scheduler={scheduler}", f"allocator={allocator}", f"output={output}"]
