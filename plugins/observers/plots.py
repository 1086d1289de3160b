"""Plots observer: draws the run's slot timeline, KV blocks and latency CDFs into its run
folder when it ends (or stops early), where the MLflow observer picks them up as artifacts.

    python run.py 'observers=[console,plots]'

Drawing happens after the engine's clock has stopped, so it never shows in a run's times.
A drawing that fails is reported on one line and the run keeps its results.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from framework.api import hookimpl


class PlotsObserver:
    """Draws the slot timeline, KV blocks and latency CDFs into the run folder."""

    def __init__(self, cfg: Any) -> None:
        self.output_dir: Path | None = None

    @hookimpl
    def on_run_start(self, run: Any) -> None:
        self.output_dir = Path(run.output_dir)

    @hookimpl
    def on_run_end(self, run: Any, summary: dict[str, Any]) -> None:
        self._draw(run)

    @hookimpl
    def on_run_abort(self, run: Any, error: BaseException, summary: dict[str, Any]) -> None:
        self._draw(run)

    def _draw(self, run: Any) -> None:
        written = ("steps.csv", "steps.csv.gz")  # a long run's is gzipped
        if self.output_dir is None or not any((self.output_dir / n).is_file() for n in written):
            return  # stopped before anything was written: nothing to draw
        # matplotlib: imported only when drawing
        from framework.tracking.plots import save_run_plots, step_columns

        try:
            # The steps in memory where the run has them: a whole day's trace is a million
            # rows of steps.csv, seconds to read back.
            result = getattr(run, "result", None)
            steps = step_columns(result.steps) if result is not None else None
            save_run_plots(self.output_dir, steps)
        except Exception as exc:  # a picture is not worth a run's exit status
            print(f"plots: not drawn: {type(exc).__name__}: {exc}", file=sys.stderr)


@hookimpl
def register_observers(register) -> None:  # type: ignore[no-untyped-def]
    register("plots", PlotsObserver)
