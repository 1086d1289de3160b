"""What an MLflow run records besides the numbers: where the store is, the config as flat
params, the machine / git / package tags, and names that say what a run or sweep varied.

Nothing here imports mlflow (that costs seconds), so `python run.py --help` stays fast.
The talking to MLflow is in `framework/tracking/store.py`; the observer that logs a run is
`plugins/observers/mlflow_logger.py`, and the Hydra callback that makes a multirun one
parent run is `framework/tracking/sweep.py`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from framework.tracking.machine import cpu_model, isa_summary

DEFAULT_URI = "sqlite:///mlflow.db"  # a file in the working directory: no server needed
PARENT_ENV = "NANOSERVE_MLFLOW_PARENT"  # set by the sweep callback for the jobs it launches
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nanoserve", "torch", "transformers", "hydra-core", "omegaconf", "mlflow", "numpy")


def tracking_uri(settings: Any) -> str:
    """Where runs go: the config's `mlflow.tracking_uri` (`MlflowConfig` in
    framework/run/config.py) wins, then `MLFLOW_TRACKING_URI`, then a SQLite file in the cwd."""
    return settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def flatten(node: Any, prefix: str = "", skip: Iterable[str] = ()) -> dict[str, str]:
    """`{"engine.block_size": "16", "workload.output_lens": "[4, 32]", ...}`: every leaf of a
    plain (resolved) container, lists kept whole as JSON so one param is one choice."""
    skip = set(skip)
    out: dict[str, str] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if name in skip:
            continue
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}.", skip))
        elif isinstance(value, str):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)  # str(): anything JSON lacks
    return out


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip()


def _gpu_name() -> str:
    import torch  # already loaded by any run; imported here so this module stays light

    if not torch.cuda.is_available():
        return "none"
    return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@cache
def environment_tags() -> dict[str, str]:
    """Where a number was measured: the code (git), the machine and the package versions.
    Times in a run describe only this machine; these tags say which machine that was."""
    commit = _git("rev-parse", "HEAD") or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no")
    tags = {
        "mlflow.source.git.commit": commit,  # MLflow's own key: shown in the UI's run list
        "git.commit": commit,
        "git.dirty": "unknown" if status is None else str(bool(status)).lower(),
        "git.branch": _git("rev-parse", "--abbrev-ref", "HEAD") or "unknown",
        "machine.host": platform.node(),
        "machine.cpu": cpu_model(),
        "machine.isa": isa_summary(),  # the flags that decide kernels: avx2 ... amx_int8
        "machine.cores": str(os.cpu_count()),
        "machine.gpu": _gpu_name(),
        "machine.platform": platform.platform(),
        "version.python": platform.python_version(),
    }
    tags.update({f"version.{p}": _version(p) for p in PACKAGES})
    return tags


def override_key(text: str) -> str:
    """`scheduler` for `scheduler=static`, `+experiment=x` or `scheduler=static,continuous`."""
    return text.split("=", 1)[0].lstrip("+~")


@dataclass(frozen=True)
class HydraJob:
    """The Hydra job a run belongs to, when it was started by `run.py`."""

    multirun: bool
    sweep_dir: str | None
    num: int | None
    overrides: tuple[str, ...]  # this job's overrides, sweeps expanded
    choices: dict[str, str]  # config group -> option (workload -> straggler)


def hydra_job() -> HydraJob | None:
    """The current Hydra job, or None for a run started in-process (tests, scripts)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    choices = {k: str(v) for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")}
    return HydraJob(
        multirun=multirun,
        sweep_dir=str(Path(hc.sweep.dir).resolve()) if multirun else None,
        num=hc.job.num if multirun else None,
        overrides=tuple(hc.overrides.task),
        choices=choices,
    )


def run_name(cfg: Any, job: HydraJob | None, swept: Iterable[str] = ()) -> str:
    """What this run varied: in a sweep, its values of the swept keys; alone, its command
    line overrides; outside Hydra, its four policies."""
    if job is not None:
        swept = set(swept)
        chosen = [o for o in job.overrides if not swept or override_key(o) in swept]
        if chosen:
            return " ".join(chosen)
        return f"job {job.num}" if job.multirun else "defaults"
    return " ".join(
        f"{g}={cfg[g].name}" for g in ("scheduler", "allocator", "preemption", "output")
    )


@dataclass(frozen=True)
class SweepPlan:
    """What a multirun will launch, as Hydra's basic sweeper expands it."""

    jobs: int | None  # None: another sweeper (optuna, ...) decides as it goes
    swept: tuple[str, ...]  # the keys that take more than one value
    sweeps: tuple[str, ...]  # those keys' overrides as given, for the parent run's name


def sweep_plan(task_overrides: Iterable[str], sweeper: Mapping[str, Any]) -> SweepPlan:
    """The job count and swept keys of a multirun: the command line's overrides after the
    sweeper's `params` (an experiment config's), expanded by the basic sweeper's own code."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides([*params, *task_overrides])
    final = {o.get_key_element(): o for o in overrides}  # a later value of a key wins
    swept = {k: o for k, o in final.items() if o.is_sweep_override()}
    sweeps = tuple(str(o.input_line) for o in swept.values())
    keys = tuple(override_key(k) for k in swept)
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return SweepPlan(None, keys, sweeps)
    try:
        (batch,) = BasicSweeper.split_arguments(overrides, None)
    except Exception:  # a sweep kind the basic sweeper refuses: Hydra will say so itself
        return SweepPlan(None, keys, sweeps)
    return SweepPlan(len(batch), keys, sweeps)
