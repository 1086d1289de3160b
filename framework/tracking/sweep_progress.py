"""Hydra callback: a progress bar of the runs of a multirun, on the terminal only.

The job count comes from the basic sweeper's own expansion of the sweep (see
`framework.tracking.sweep_plan`); other sweepers get a bar without a total. The bar moves
when a job ends in this process, so it is shown for the basic launcher only; the others
(joblib, SLURM, Ray) end jobs in other processes and report through their own logs.
Each job's console line is written through `tqdm.write`, above the bar; the bar closes with
the last job, before the sweep's table is printed below it.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from tqdm import tqdm

from framework.tracking.tags import sweep_plan


class SweepProgress(Callback):
    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Launchers pickle callbacks to their workers; a bar cannot travel."""
        return {"bar": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not str(config.hydra.launcher.get("_target_", "")).endswith("BasicLauncher"):
            return  # the jobs end in other processes: this bar would never move
        plan = sweep_plan(config.hydra.overrides.task, config.hydra.sweeper)
        # disable=None: quiet when stderr is not a terminal.
        self.bar = tqdm(total=plan.jobs, desc="runs", unit="run", disable=None)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if self.bar.total is not None and self.bar.n >= self.bar.total:
                self.on_multirun_end(config)  # gone before the sweep's tables are printed

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
