"""MLflow observer: every run becomes an MLflow run, through the same hooks any plugin uses.

- at the start, done before the engine's clock starts (a run's start-up, so it costs no
  measured time): the run, nested under its sweep's parent run in a multirun, named after
  what it varied, tagged with the git commit, the machine and the package versions, with the
  whole resolved config as flat params (`scheduler.name`, `engine.block_size`, ...);
- at each step: a few numbers kept in memory (no call to the store), pooled into at most
  `mlflow.max_step_points` points per series (`framework/tracking/series.py`: a trace of a
  million steps would otherwise take the store a quarter of an hour);
- at the end: the summary of `metrics.json` as metrics under the same names, the per-step
  series (`step.rows`, `step.blocks_in_use`, `step.waste_so_far`, `step.window`,
  `step.waiting`) sent in batches of 1000, and the run folder's files as artifacts, up to
  `mlflow.max_artifact_mb` (smallest first; the rest named in the run's tags);
- when the run stops early (`on_run_abort`): what exists, and the status KILLED for Ctrl-C,
  FAILED otherwise.

A store that is down or fails half way costs the run nothing: it finishes, writes its local
results, and this observer prints `MLflow: not logged: <reason>` (`mlflow.fatal=true` makes
that an error instead). It runs after the other observers (`trylast`), so the plots they draw
are in the folder when it uploads it. A single run is logged by a helper process
(`mlflow.background`, framework/tracking/background.py): the same calls, in the same order
(`finish_run`). It opens the run before the first step and logs the rest after the
last, while this process waits: it never runs beside the engine's steps, and the wait before
the first step is start-up (`startup_observers_s`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from framework.api import hookimpl
from framework.tracking.artifacts import left_out_text, pick_artifacts
from framework.tracking.background import BackgroundRun, finish_run
from framework.tracking.series import StepSeries
from framework.tracking.store import TrackingStore
from framework.tracking.tags import (
    PARENT_ENV,
    HydraJob,
    environment_tags,
    flatten,
    hydra_job,
    run_name,
)


class MlflowLogger:
    """Logs every run as an MLflow run: config, metrics, per-step series, files, tags."""

    def __init__(self, cfg: Any) -> None:
        self.store = TrackingStore(cfg.mlflow)
        self.settings = {k: cfg.mlflow.get(k) for k in ("tracking_uri", "experiment", "fatal")}
        self.background_setting = cfg.mlflow.get("background")
        self.background: BackgroundRun | None = None  # the helper process, when it logs
        self.run_id: str | None = None
        self.quiet = False  # a job of a sweep: the sweep says where its runs are
        self.output_dir: Path | None = None
        self.max_step_points = int(cfg.mlflow.get("max_step_points", 2000))
        self.max_artifact_mb = cfg.mlflow.get("max_artifact_mb")
        self.series: StepSeries | None = None  # made at the start, once the run checked the field
        self._t0_ms = 0
        self.spent_s = {"before the first step": 0.0, "after the last": 0.0}  # off the clock

    # ---- hooks ---------------------------------------------------------------------------
    @hookimpl
    def on_run_start(self, run: Any) -> None:
        t = time.perf_counter()
        self._open(run)
        self.spent_s["before the first step"] = time.perf_counter() - t
        self._t0_ms = int(time.time() * 1000)

    def _open(self, run: Any) -> None:
        """The run opened in the store, with its tags and params: done when this returns."""
        self.output_dir = Path(run.output_dir)
        self.series = StepSeries(self.max_step_points)
        job = hydra_job()
        parent, swept = self._parent(job)
        tags = {
            **environment_tags(),
            "mlflow.source.name": "run.py",
            "nanoserve.kind": "job" if parent else "run",
            # model or simulated: whether the run's seconds were measured or predicted
            "nanoserve.executor": str(run.config.executor.name),
            "nanoserve.output_dir": str(self.output_dir.resolve()),
        }
        # In a sweep the parent run's line at the end says where the runs went: no line each.
        self.quiet = parent is not None
        name = run_name(run.config, job, swept)
        if self._in_background(job):
            # Waits until the run is open in the store: start-up, before the engine's clock.
            params = self.store.attempt("reading the config", lambda: self._params(run, job))
            self.background = BackgroundRun()
            self.background.start((self.settings, name, tags, parent, params or {}))
        else:
            self.run_id = self.store.start_run(name, tags, parent)
            if self.run_id is not None:
                params = self.store.attempt("reading the config", lambda: self._params(run, job))
                if params is not None:
                    self.store.log_params(self.run_id, params)

    def _in_background(self, job: HydraJob | None) -> bool:
        """Whether a helper process logs this run (`mlflow.background`; see
        framework/tracking/background.py). Never with `fatal=true`, whose failing store must
        fail the run at its start; by default, where it saves the most and changes the
        least: a single run (a sweep's jobs find their parent run here), in a process that
        has not imported mlflow yet (else the import is paid already, only the store left)."""
        if self.store.fatal:
            return False
        if self.background_setting is not None:
            return bool(self.background_setting)
        return not ((job is not None and job.multirun) or "mlflow" in sys.modules)

    @hookimpl
    def on_step_end(self, stats: Any) -> None:
        assert self.series is not None, "on_step_end before on_run_start"
        self.series.add(
            stats.step,
            self._t0_ms + int(stats.time * 1000),
            stats.rows,
            stats.tokens_kept,
            stats.blocks_in_use,
            stats.window,
            stats.waiting,
        )

    @hookimpl(trylast=True)
    def on_run_end(self, run: Any, summary: dict[str, Any]) -> None:
        self._finish(summary, "FINISHED", None)

    @hookimpl(trylast=True)
    def on_run_abort(self, run: Any, error: BaseException, summary: dict[str, Any]) -> None:
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self._finish(summary, status, error)

    # ---- helpers -------------------------------------------------------------------------
    def _parent(self, job: HydraJob | None) -> tuple[str | None, tuple[str, ...]]:
        """The sweep's parent run and swept keys: from the environment the sweep callback set
        (same process, joblib, SLURM), else by the sweep folder's tag (remote launchers)."""
        if job is None or not job.multirun:
            return None, ()
        env = json.loads(os.environ.get(PARENT_ENV) or "{}")
        if env.get("sweep_dir") == job.sweep_dir:
            return env["run_id"], tuple(env["swept"])
        found = self.store.find_run("nanoserve.sweep_dir", str(job.sweep_dir))
        if found is None:
            return None, ()
        run_id, tags = found
        return run_id, tuple(json.loads(tags.get("nanoserve.swept", "[]")))

    @staticmethod
    def _params(run: Any, job: HydraJob | None) -> dict[str, str]:
        """The resolved config as flat params (a plugin's Enum field as its name)."""
        resolved = OmegaConf.to_container(run.config, resolve=True, enum_to_str=True)
        params = flatten(resolved, skip=["mlflow"])  # a server URI may hold a password
        if job is not None:
            params.update({f"choice.{g}": v for g, v in job.choices.items()})
        return params

    def _finish(self, summary: dict[str, Any], status: str, error: BaseException | None) -> None:
        t = time.perf_counter()
        # A simulated run says what predicted its seconds (an analytic profile, say); a
        # real one which kernels this machine got, and how they were chosen.
        tags = {
            f"nanoserve.{k}": str(summary[k])
            for k in (
                "clock",
                "cost_model",
                "profile",
                "hardware",
                "tensor_parallel",
                "interconnect",
                "speed",
                "compute_speed",
                "overlap",
                "linears",
                "decode_attention",
                "prefill_attention",
                "argmax",
                "layer_glue",
            )
            if k in summary
        }
        if error is not None:
            tags["nanoserve.error"] = repr(error)
        series = list(self.series.points()) if self.series is not None else []
        files = (
            sorted(self.output_dir.iterdir())
            if self.output_dir is not None and self.output_dir.is_dir()
            else []
        )
        files, left = pick_artifacts(files, self.max_artifact_mb)
        if left:  # past mlflow.max_artifact_mb: named in the run, kept in the folder
            tags["nanoserve.artifacts_left_out"] = left_out_text(left, self.output_dir)
        broken = self.store.broken
        if self.background is not None:
            finish = (status, tags, summary, series, [str(f) for f in files])
            self.run_id, broken = self.background.finish(finish)
        elif self.run_id is not None:
            finish_run(self.store, self.run_id, status, tags, summary, series, files)
            broken = self.store.broken
        self.spent_s["after the last"] = time.perf_counter() - t
        if broken is not None:
            where = f"; results are in {self.output_dir}" if self.output_dir else ""
            print(f"MLflow: not logged: {broken}{where}", file=sys.stderr, flush=True)
        elif self.run_id is not None and not self.quiet:
            spent = ", ".join(f"{v:.2f} s {k}" for k, v in self.spent_s.items())
            print(
                f"MLflow: logged run {self.run_id} ({status.lower()}) to {self.store.uri}, "
                f"experiment {self.store.experiment!r} ({spent})",
                flush=True,
            )
        if left and broken is None and not self.quiet:
            print(
                f"MLflow: not uploaded (over mlflow.max_artifact_mb={self.max_artifact_mb}): "
                f"{left_out_text(left, self.output_dir)}",
                flush=True,
            )


@hookimpl
def register_observers(register) -> None:  # type: ignore[no-untyped-def]
    register("mlflow", MlflowLogger)
