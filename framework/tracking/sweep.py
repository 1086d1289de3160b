"""Hydra callback: a multirun is one MLflow parent run, each job a child nested under it, so
one click in `mlflow ui` compares a whole sweep.

At the start of a multirun it opens the parent run, named after what the sweep varies
(`sweep: scheduler=static,continuous allocator=worst_case,incremental`), and tells the jobs
its id through the environment (`NANOSERVE_MLFLOW_PARENT`: inherited by in-process jobs,
joblib workers and SLURM jobs); the jobs' MLflow observer also finds it by its sweep folder
tag, for launchers that do not pass the environment on. At the end it uploads the files at
the top of the sweep folder (the sweep's table `sweep.md`/`.csv`, a study's table and plot,
`multirun.yaml`), closes the run and says last where to find it (`MLflow parent run: ID`);
if the process ends first (a job failed, a study refused to compare, Ctrl-C), it does the
same at exit and closes the run as FAILED.

Hydra turns an exception in a callback into a warning, so nothing here raises: a store
that fails is reported on one line, and each job's own observer applies `mlflow.fatal`.

Hydra calls the end hooks of callbacks in reverse order, so a study callback listed after
this one (`hydra.callbacks.study`, added by `+experiment=NAME`) has written its table by then.
Only active when the run config's `observers` include `mlflow`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from framework.tracking.store import TrackingStore
from framework.tracking.sweep_exit import at_early_end, done
from framework.tracking.tags import PARENT_ENV, environment_tags, sweep_plan

SWEEP_FILES = (".md", ".csv", ".png", ".txt", ".yaml", ".json")


class SweepTracking(Callback):
    def __init__(self) -> None:
        self.store: TrackingStore | None = None
        self.run_id: str | None = None
        self.sweep_dir: Path | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Launchers pickle callbacks to their workers; the client stays here."""
        return {"store": None, "run_id": self.run_id, "sweep_dir": self.sweep_dir}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "mlflow" not in config.get("observers", []):
            return
        plan = sweep_plan(config.hydra.overrides.task, config.hydra.sweeper)
        self.sweep_dir = Path(config.hydra.sweep.dir).resolve()
        self.store = TrackingStore(config.mlflow)
        tags = {
            **environment_tags(),
            "mlflow.source.name": "run.py",
            "nanoserve.kind": "sweep",
            "nanoserve.sweep_dir": str(self.sweep_dir),
            "nanoserve.swept": json.dumps(list(plan.swept)),
        }
        study = config.hydra.callbacks.get("study")
        name = f"study {study.name}: " if study is not None else "sweep: "
        self.run_id = self.store.start_run(name + " ".join(plan.sweeps), tags)
        if self.run_id is None:
            print(f"MLflow: sweep not logged: {self.store.broken}", file=sys.stderr, flush=True)
            return
        self.store.log_params(
            self.run_id,
            {
                "sweep": " ".join(plan.sweeps),
                "jobs": str(plan.jobs),
                "overrides": " ".join(config.hydra.overrides.task),
            },
        )
        os.environ[PARENT_ENV] = json.dumps(
            {"run_id": self.run_id, "sweep_dir": str(self.sweep_dir), "swept": list(plan.swept)}
        )
        # A failed job, a refused study or Ctrl-C ends the process before on_multirun_end.
        at_early_end(self._close_failed)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        done(self._close_failed)
        self._close("FINISHED")

    def _close_failed(self) -> None:
        self._close("FAILED")

    def _close(self, status: str) -> None:
        """Upload the files at the top of the sweep folder and close the parent run."""
        os.environ.pop(PARENT_ENV, None)
        if self.store is None or self.run_id is None or self.sweep_dir is None:
            return
        files = [p for p in sorted(self.sweep_dir.iterdir()) if p.suffix in SWEEP_FILES]
        self.store.log_files(self.run_id, files)
        self.store.end_run(self.run_id, status)
        if self.store.broken is not None:
            print(f"MLflow: sweep not logged: {self.store.broken}", file=sys.stderr, flush=True)
        else:
            print(
                f"MLflow parent run: {self.run_id} ({status.lower()}; experiment "
                f"'{self.store.experiment}', {view_hint(self.store.uri)})",
                flush=True,
            )
        self.run_id = None


def view_hint(uri: str) -> str:
    """How to look at the store: a server is opened in a browser, a file by `mlflow ui`."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):  # relative to the cwd
        uri = prefix + str(Path(uri[len(prefix) :]).resolve())
    return f"`mlflow ui --backend-store-uri {uri}`"
