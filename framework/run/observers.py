"""Run a job with the configured observers attached to the plugin hooks, and detached after
(so a multirun does not pile up observers from earlier jobs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from framework.plugin_host.registry import registry
from framework.run.app import run_batch
from framework.run.errors import UserError
from framework.run.run_info import RunInfo


def run_with_observers(
    cfg: DictConfig,
    output_dir: str | Path,
    loaded: tuple[Any, ...] | None = None,
    runner: Callable[..., RunInfo] | None = None,
) -> RunInfo:
    """`runner` (default `run_batch`) with `(cfg, output_dir, hooks, loaded)`; the
    HTTP server (`framework.serve.server.serve_http`) is run the same way."""
    reg = registry()
    attached: list[Any] = []
    try:  # an observer that fails to start detaches the ones started before it
        for name in cfg.observers:
            if name not in reg.observers:
                choices = ", ".join(
                    f"{n} ({p.label})" for n, (_, p) in sorted(reg.observers.items())
                )
                raise UserError(f"observers: {name!r} is not registered; available: {choices}")
            factory, _ = reg.observers[name]
            obs = factory(cfg)
            reg.pm.register(obs, name=f"observer:{name}")
            attached.append(obs)
        return (runner or run_batch)(cfg, Path(output_dir), reg.pm.hook, loaded)
    finally:
        for obs in attached:
            reg.pm.unregister(obs)
