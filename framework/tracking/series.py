"""The per-step series sent to MLflow, kept to a bounded number of points.

A run of a whole day's trace under the simulated executor takes about a million steps. Sent
point by point, its five series were 5.3 million metrics: the SQLite store took 16 of the
command's 20 minutes to write them (the engine itself took about one), and MLflow's charts
draw a few hundred points of a series anyway. `steps.csv` keeps every step; MLflow gets each
series as at most `max_points` points.

Up to `max_points` steps, a point is a step. Beyond, consecutive steps are pooled into
buckets whose width doubles each time the buckets would outnumber `max_points` (adjacent
buckets merged pairwise), so memory stays bounded while the run goes on and the whole run is
covered evenly. A bucket's point sits at its last step and time, and holds the mean over the
bucket's steps: rows, blocks in use, the window and the waiting queue as averages (a spike
shorter than a bucket is flattened: `steps.csv` has it); the waste so far is exact at every
point (from the bucket sums of rows computed and tokens kept), so the last point still
equals the run's `waste_fraction`.
"""

from __future__ import annotations

from collections.abc import Iterator

# Summed per bucket: the series' means come from these, the waste from the two counts.
_ROWS, _KEPT, _BLOCKS, _WINDOW, _WAITING = range(5)
_SUMS = 5


class StepSeries:
    """Per-step numbers pooled into at most `max_points` points per series."""

    def __init__(self, max_points: int = 2000) -> None:
        if max_points < 2:
            raise ValueError(f"mlflow.max_step_points must be >= 2; got {max_points}")
        self.max_points = max_points
        self.width = 1  # steps a bucket holds once full
        # Per bucket: [last step, its time (ms), steps in it, the sums (_SUMS of them)]
        self.buckets: list[list[float]] = []

    def add(
        self, step: int, t_ms: int, rows: int, kept: int, blocks: int, window: float, waiting: int
    ) -> None:
        b = self.buckets[-1] if self.buckets else None
        if b is None or b[2] >= self.width:
            if len(self.buckets) >= self.max_points:
                self._merge_pairs()
                b = self.buckets[-1]
            if b is None or b[2] >= self.width:
                b = [0, 0, 0, *([0.0] * _SUMS)]
                self.buckets.append(b)
        b[0], b[1] = step, t_ms
        b[2] += 1
        b[3 + _ROWS] += rows
        b[3 + _KEPT] += kept
        b[3 + _BLOCKS] += blocks
        b[3 + _WINDOW] += window
        b[3 + _WAITING] += waiting

    def _merge_pairs(self) -> None:
        """Twice the width: each bucket merged with the next (the later one's step and time)."""
        merged = []
        for i in range(0, len(self.buckets), 2):
            a = self.buckets[i]
            if i + 1 < len(self.buckets):
                b = self.buckets[i + 1]
                a = [b[0], b[1], a[2] + b[2], *(x + y for x, y in zip(a[3:], b[3:], strict=True))]
            merged.append(a)
        self.buckets = merged
        self.width *= 2

    def points(self) -> Iterator[tuple[str, float, int, int]]:
        """`(key, value, timestamp_ms, step)` rows for `TrackingStore.log_metrics`."""
        rows = kept = 0.0
        for step, t, n, *sums in self.buckets:
            rows += sums[_ROWS]
            kept += sums[_KEPT]
            # waste so far = 1 - kept / computed rows: it ends equal to the summary's
            # waste_fraction (tokens still held on the device count as waste until they land).
            waste = 1.0 - kept / rows if rows else 0.0
            at, s = int(t), int(step)
            yield ("step.rows", sums[_ROWS] / n, at, s)
            yield ("step.blocks_in_use", sums[_BLOCKS] / n, at, s)
            yield ("step.waste_so_far", waste, at, s)
            yield ("step.window", sums[_WINDOW] / n, at, s)
            yield ("step.waiting", sums[_WAITING] / n, at, s)
