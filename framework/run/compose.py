"""A run config composed from Hydra overrides in Python, from the same `conf/` that
`python run.py` reads: for the tools, studies and notebooks that run configs without Hydra's
command line. What Hydra refuses in the overrides is the user's mistake, as one line
(`UserError`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from framework.run.cli import hydra_user_error
from framework.run.config import register_configs
from framework.run.errors import UserError
from framework.run.paths import CONF


def compose_config(overrides: Sequence[str], hydra: bool = False) -> DictConfig:
    """A fresh run config of `overrides` (with Hydra's own `hydra` node when `hydra`, as a
    job sees it: its run folder, its choices)."""
    with _composing():
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def compose_sweep_config(overrides: Sequence[str]) -> DictConfig:
    """The config a multirun of `overrides` starts from (`python run.py -m OVERRIDES`), with
    Hydra's node: its sweep folder resolved now, its sweeps not yet expanded into jobs."""
    from hydra.types import RunMode

    with _composing():
        app = GlobalHydra.instance().hydra
        assert app is not None  # initialize_config_dir made it
        return app.compose_config(
            "config", list(overrides), run_mode=RunMode.MULTIRUN, with_log_configuration=False
        )


def compose_cfg(overrides: Sequence[str]) -> DictConfig:
    """The run config of `overrides`, composed once per distinct override list (Hydra takes
    a good part of a second) and shared: derive another by composing other overrides, never
    by assigning to a returned one."""
    return _composed(tuple(overrides))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    return compose_config(overrides)


@contextlib.contextmanager
def _composing() -> Iterator[None]:
    """Hydra initialised on `conf/` (the built-in policies' configs registered), apart from
    any Hydra app already running; what Hydra refuses raised as the user's `UserError`."""
    register_configs()
    try:
        with (
            _apart_from_running_app(),
            initialize_config_dir(version_base="1.3", config_dir=str(CONF)),
        ):
            yield
    except Exception as error:
        message = hydra_user_error(error)
        if message is None:
            raise
        raise UserError(message) from error


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
