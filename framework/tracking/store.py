"""One MLflow tracking store, as the run observer and the sweep callback use it: a run opened
and closed, params, metrics, series and files logged in batches.

A store that cannot be reached, or fails half way, must not cost a run its results: the
first failure is remembered as `broken` (with a one-line reason), every later call does
nothing, and the caller says at the end that the run was not logged. With
`mlflow.fatal=true` the failure is raised instead, as `TrackingError`.

mlflow is imported on first use (two seconds or more), never at import.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from framework.tracking.sqlite_template import seed
from framework.tracking.tags import tracking_uri

T = TypeVar("T")
PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
METRICS_PER_BATCH = 1000
MAX_PARAM_CHARS = 6000
# Set before mlflow is imported, unless the user set them: MLflow's HTTP defaults (120 s per
# request, 7 retries with backoff) wait minutes for a dead server; and its usage telemetry
# fetches a config and sends events from threads of their own, beside whatever the process
# does next (the engine's steps, for the helper of framework/tracking/background.py).
ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


class TrackingError(RuntimeError):
    """The tracking store failed and `mlflow.fatal=true` asked for the run to fail too."""


def failure_reason(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


def _chunks(items: list[T], n: int) -> Iterable[list[T]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


class TrackingStore:
    """A lazily connected `MlflowClient` for one experiment, failing softly (see module)."""

    def __init__(self, settings: Any) -> None:
        """`settings`: the run config's `mlflow` block (tracking_uri, experiment, fatal)."""
        self.uri = tracking_uri(settings)
        self.experiment = str(settings.experiment)
        self.fatal = bool(settings.fatal)
        self.broken: str | None = None  # the first failure, once there was one
        self._client: Any = None
        self._experiment_id: str | None = None

    # ---- failure policy ------------------------------------------------------------------
    def attempt(self, what: str, fn: Callable[[], T]) -> T | None:
        """`fn()`, or None once the store has failed (now or before)."""
        if self.broken is not None:
            return None
        try:
            return fn()
        except Exception as exc:
            self.broken = f"{what} at {self.uri} failed: {failure_reason(exc)}"
            if self.fatal:
                raise TrackingError(
                    f"MLflow: {self.broken} (mlflow.fatal=true, so the run fails)"
                ) from exc
            return None

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        """`client.<method>(*args, **kwargs)` through `attempt`. The client is fetched inside
        the attempt (connecting may fail too), and the arguments are bound by this call, not
        by a lambda in the caller's loop (which would see the loop's last values)."""
        self.attempt(what, lambda: getattr(self.client, method)(*args, **kwargs))

    # ---- connection ----------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            # A dead server should cost seconds, not MLflow's minutes of retries, and no
            # telemetry thread runs; the user's own settings of these win.
            for name, value in ENV_DEFAULTS.items():
                os.environ.setdefault(name, value)
            from mlflow import MlflowClient

            # A new SQLite store: a copy of a migrated one, not 3 s of migrations. A cache that
            # cannot be written leaves the store to MLflow, as before.
            with contextlib.suppress(OSError):
                seed(self.uri)
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._find_or_create_experiment()
        return self._experiment_id

    def _find_or_create_experiment(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                created: str = self.client.create_experiment(
                    self.experiment, artifact_location=self._artifact_location()
                )
                return created
            except Exception:  # created meanwhile by a parallel job of the same sweep
                found = self.client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
        experiment_id: str = found.experiment_id
        return experiment_id

    def _artifact_location(self) -> str | None:
        """For a SQLite store, artifacts go beside the database file (`mlruns/NAME`), not
        into whatever folder the first run happened to start in; a server decides its own."""
        prefix = "sqlite:///"
        if not self.uri.startswith(prefix) or self.uri == prefix + ":memory:":
            return None
        db = Path(self.uri[len(prefix) :]).resolve()
        return (db.parent / "mlruns" / self.experiment).as_uri()

    # ---- runs ----------------------------------------------------------------------------
    def start_run(
        self, name: str, tags: Mapping[str, str], parent: str | None = None
    ) -> str | None:
        """A new run (a child of `parent` when given); its id, or None if the store failed."""

        def start() -> str:
            all_tags = dict(tags)
            if parent:
                all_tags["mlflow.parentRunId"] = parent  # what makes MLflow nest it
            run = self.client.create_run(self.experiment_id(), run_name=name, tags=all_tags)
            return run.info.run_id

        return self.attempt("starting the run", start)

    def find_run(self, tag: str, value: str) -> tuple[str, dict[str, str]] | None:
        """(run id, tags) of the newest run of this experiment with `tag == value`."""

        def find() -> tuple[str, dict[str, str]] | None:
            runs = self.client.search_runs(
                [self.experiment_id()],
                filter_string=f"tags.`{tag}` = '{value}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            return (runs[0].info.run_id, dict(runs[0].data.tags)) if runs else None

        return self.attempt("finding the sweep's parent run", find) or None

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:MAX_PARAM_CHARS]) for k, v in params.items()]
        for chunk in _chunks(items, PARAMS_PER_BATCH):
            self._call("logging params", "log_batch", run_id, params=chunk)

    def log_metrics(
        self, run_id: str, series: Iterable[tuple[str, float, int, int]], what: str = "metrics"
    ) -> None:
        """`(key, value, timestamp_ms, step)` rows, sent 1000 to a call."""
        from mlflow.entities import Metric

        items = [Metric(k, float(v), ts, step) for k, v, ts, step in series]
        for chunk in _chunks(items, METRICS_PER_BATCH):
            self._call(f"logging {what}", "log_batch", run_id, metrics=chunk)

    def log_summary(self, run_id: str, summary: Mapping[str, Any]) -> None:
        """The numeric entries of a summary, at step 0 (None and text are skipped); a
        cluster's per-replica rows as `replica.<i>.<metric>`."""
        now = int(time.time() * 1000)
        flat = dict(summary)
        for row in summary.get("replicas") or ():
            flat.update({f"replica.{row['replica']}.{k}": v for k, v in row.items()})
        rows = [(k, float(v), now, 0) for k, v in flat.items() if isinstance(v, int | float)]
        self.log_metrics(run_id, rows, "the summary")

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:MAX_PARAM_CHARS]) for k, v in tags.items()]
        for chunk in _chunks(items, PARAMS_PER_BATCH):
            self._call("setting tags", "log_batch", run_id, tags=chunk)

    def log_files(self, run_id: str, paths: Iterable[Path]) -> None:
        """Each file at the artifact root, each folder as a folder of that name."""
        for path in paths:
            if path.is_dir():
                self._call(f"uploading {path.name}/", "log_artifacts", run_id, str(path), path.name)
            elif path.is_file():
                self._call(f"uploading {path.name}", "log_artifact", run_id, str(path))

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Close the run as FINISHED, FAILED or KILLED (Ctrl-C). After a failure half way,
        one last try marks it FAILED, so the UI does not show it running for ever."""
        if self.broken is None:
            self.attempt("closing the run", lambda: self.client.set_terminated(run_id, status))
            return
        with contextlib.suppress(Exception):  # the store is down: `broken` says why
            self.client.set_terminated(run_id, "FAILED" if status == "FINISHED" else status)
