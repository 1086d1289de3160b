"""Progress observer: a bar of finished requests inside a run, with the step count, on the
terminal only (quiet when stderr is not a terminal: logs, CI, pipes).

It starts nothing beside the engine: tqdm's monitor thread (which wakes every ten seconds to
retune a bar) is off, and the bar redraws, in the step that finished a request, at most ten
times a second (a write of one line to the terminal, inside the step's `hooks` time).

In a multirun started in one process the sweep's own bar of runs
(`framework/tracking/sweep_progress.py`) stays above it: tqdm stacks the bars by itself.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from framework.api import hookimpl


class Bar(tqdm):
    """tqdm without its monitor thread."""

    monitor_interval = 0


class ProgressObserver:
    """A progress bar of finished requests, on a terminal only."""

    def __init__(self, cfg: Any) -> None:
        self.bar: Bar | None = None
        self.last: Any = None  # the newest step's stats, shown when the bar next moves

    @hookimpl
    def on_run_start(self, run: Any) -> None:
        # disable=None: tqdm switches itself off when stderr is not a terminal.
        self.bar = Bar(
            total=run.num_requests, desc="requests", unit="req", leave=False, disable=None
        )

    @hookimpl
    def on_step_end(self, stats: Any) -> None:
        # Kept, not formatted: the bar redraws only when a request finishes, and a whole
        # day's trace is a million steps for twenty thousand requests.
        self.last = stats

    @hookimpl
    def on_request_finished(self, request: Any) -> None:
        if self.bar is not None:
            if self.last is not None and not self.bar.disable:
                self.bar.set_postfix(step=self.last.step, rows=self.last.rows, refresh=False)
            self.bar.update(1)

    @hookimpl(tryfirst=True)  # gone before the other observers print their results
    def on_run_end(self, run: Any, summary: dict[str, Any]) -> None:
        self._close()

    @hookimpl(tryfirst=True)
    def on_run_abort(self, run: Any, error: BaseException, summary: dict[str, Any]) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@hookimpl
def register_observers(register) -> None:  # type: ignore[no-untyped-def]
    register("progress", ProgressObserver)
