"""One run's MLflow logging in a helper process that never runs while the engine steps.

Importing mlflow and opening a new SQLite store (its tables made and migrated) take seconds
(figures: docs/measurements/tracking.md). On a 2-core machine the engine takes both cores,
so there is no spare one to hide that work on: a helper busy beside the engine's first steps
made a run's makespan a quarter longer and its TTFT half as long again. So the helper works
only while the run's process waits for it, at the two moments outside the engine's clock:

- **before the first step** (`start`): the helper imports mlflow, opens the store (a new one
  made and migrated first), opens the run and logs its params, and replies; the run's process
  waits for that reply. The wait is the run's start-up (`startup_observers_s`).
- **after the last step** (`finish`): this process sends the rest (tags, summary, per-step
  series, the run folder's files, the status), the helper logs it and says how it went.

In between, while the engine steps, the helper is blocked on its pipe and uses no CPU (MLflow's
usage telemetry, whose threads would send beside the steps, is off: `store.ENV_DEFAULTS`). What
the helper still spares the run is mlflow itself: this process never imports it, so its
thousands of modules and objects stay out of the engine's heap and its collector's passes.

The helper fails as softly as the store does in-process (`TrackingStore`): a helper that
cannot start, dies or cannot reach the store costs the run nothing, and the reason comes back
as `broken`. It runs in a session of its own, so Ctrl-C on the terminal reaches only the run,
which then closes the MLflow run as KILLED; should this process end without closing it, the
helper closes it as FAILED.

    python -m framework.tracking.background   # the helper: messages on stdin, replies on stdout
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

from framework.tracking.store import TrackingStore, failure_reason

# What the helper is sent at the start: (settings, run name, tags, parent run, params).
Start = tuple[dict[str, Any], str, dict[str, str], str | None, dict[str, str]]
# And at the end: (status, tags, summary, series rows, files).
Finish = tuple[str, dict[str, str], dict[str, Any], list[tuple[str, float, int, int]], list[str]]

ORPHANED = "the run's process ended without closing its MLflow run"


def finish_run(
    store: TrackingStore,
    run_id: str,
    status: str,
    tags: Mapping[str, str],
    summary: Mapping[str, Any],
    series: Sequence[tuple[str, float, int, int]],
    files: Sequence[Path],
) -> None:
    """The end of a run, in the order both the observer and the helper log it: its tags,
    the summary as metrics, the per-step series, the run folder's files, the status."""
    if tags:
        store.set_tags(run_id, tags)
    store.log_summary(run_id, summary)
    if series:
        store.log_metrics(run_id, series, "the per-step series")
    if files:
        store.log_files(run_id, files)
    store.end_run(run_id, status)


class BackgroundRun:
    """This process's end of the helper: `start` starts it, sends the run's opening and
    waits until it is logged; `finish` sends the rest and waits for the helper to log it,
    returning (run id, broken)."""

    def __init__(self) -> None:
        self.broken: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: list[tuple[str, str | None, str | None]] = []  # (what, run id, broken)
        self._finish_sent = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, start: Start) -> None:
        """Start the helper, send it the run's opening and wait until it has opened the
        store and the run and logged the params, so that nothing of it is left to do once
        the engine runs (this is start-up: the engine's clock has not started)."""
        env = dict(os.environ)
        # The helper imports this package from where this process found it, whatever the
        # working directory (run.py's folder is on this process's path, not the helper's).
        root = str(Path(__file__).resolve().parents[2])  # framework/tracking/ is two down
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "framework.tracking.background"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # Ctrl-C stops the run, which closes the MLflow run
            )
            self._send(start)
        except Exception as exc:  # no such interpreter, no process left, a value unsendable
            self._fail(f"starting the MLflow helper process failed: {failure_reason(exc)}")
            return
        self._receive()  # ("started", run id, broken)

    def finish(self, finish: Finish) -> tuple[str | None, str | None]:
        """Send the end of the run, wait until the helper has logged it; (run id, broken).

        Interrupted while it waits (Ctrl-C as the files upload), a second call (the run's
        abort) waits on: the end was sent once, and the helper logs it whole."""
        proc = self._proc
        if proc is None or self.broken is not None:
            return None, self.broken
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if not self._finish_sent:
                self._finish_sent = True
                self._send(finish)
                proc.stdin.close()
        except Exception as exc:  # it died, or a value could not be sent: not logged
            self._died(exc)
        while len(self._replies) < 2:  # ("started", ...) and ("done", ...)
            if not self._receive():
                return None, self.broken
        proc.stdout.close()
        proc.wait()
        self._proc = None
        _, run_id, broken = self._replies[-1]
        return run_id, broken

    def _receive(self) -> bool:
        """The helper's next reply, kept; False once it has failed instead."""
        if self._proc is None or self.broken is not None:
            return False
        assert self._proc.stdout is not None
        try:
            self._replies.append(pickle.load(self._proc.stdout))
        except Exception as exc:  # it died, or said something unreadable
            self._died(exc)
            return False
        return True

    def _died(self, exc: BaseException) -> None:
        code = self._proc.poll() if self._proc is not None else None
        said = "" if code is None else f" (exit status {code})"
        self._fail(f"the MLflow helper process failed{said}: {failure_reason(exc)}")

    def _send(self, message: Any) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        pickle.dump(message, self._proc.stdin)
        self._proc.stdin.flush()

    def _fail(self, reason: str) -> None:
        self.broken = reason
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


def _reply(out: IO[bytes], message: Any) -> None:
    """Say how it went; to no one, quietly, once the run's process has gone (Ctrl-C while
    it waited for the end to be logged)."""
    try:
        pickle.dump(message, out)
        out.flush()
    except BrokenPipeError:
        pass


def main() -> None:
    """The helper: open the run, wait for its end, log it, reply; see the module's note."""
    inp = sys.stdin.buffer
    # The replies go out on a copy of stdout; fd 1 itself becomes stderr, so that anything
    # mlflow prints lands on the terminal and not in the channel.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    settings, name, tags, parent, params = pickle.load(inp)
    store = TrackingStore(SimpleNamespace(**settings))
    run_id = store.start_run(name, tags, parent)
    if run_id is not None:
        store.log_params(run_id, params)
    _reply(out, ("started", run_id, store.broken))
    try:
        status, end_tags, summary, series, files = pickle.load(inp)
    except EOFError:  # the run's process is gone: the run did not finish
        status, end_tags = "FAILED", {"nanoserve.error": ORPHANED}
        summary, series, files = {}, [], []
    if run_id is not None:
        finish_run(store, run_id, status, end_tags, summary, series, [Path(f) for f in files])
    _reply(out, ("done", run_id, store.broken))


if __name__ == "__main__":
    main()
