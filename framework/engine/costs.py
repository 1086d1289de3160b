"""Measured costs that output policies may use: one host readback, one more decode row.

Seconds describe this machine only; they feed decisions, never reported counts.
"""

from __future__ import annotations

import statistics
from collections import deque


class CostModel:
    def __init__(self, history: int = 64) -> None:
        self._forwards: deque[tuple[int, float]] = deque(maxlen=history)
        self._transfers: deque[float] = deque(maxlen=history)
        # Read several times a step, changed at most once: each estimate is kept until the
        # next observation (recomputing them was 3% of a simulated step's host work).
        self._row_s: float | None = None
        self._transfer_s: float | None = None
        self._row_stale = self._transfer_stale = False

    def observe_forward(self, decode_rows: int, seconds: float) -> None:
        """A decode-only forward: its row count and time (prefill steps would skew the slope)."""
        self._forwards.append((decode_rows, seconds))
        self._row_stale = True

    def observe_transfer(self, seconds: float) -> None:
        self._transfers.append(seconds)
        self._transfer_stale = True

    @property
    def transfer_s(self) -> float | None:
        if self._transfer_stale:
            self._transfer_s = float(statistics.median(self._transfers))
            self._transfer_stale = False
        return self._transfer_s

    @property
    def row_s(self) -> float | None:
        """Marginal seconds per decode row: the least-squares slope of forward time over rows,
        or the mean time per row while every forward had the same width.

        Read every step, so in closed form over the (at most `history`) points: numpy's
        polyfit cost ~0.1 ms a step, a tenth of the engine's whole host work at 32 rows.
        """
        if self._row_stale:
            self._row_s = self._fit_row_s()
            self._row_stale = False
        return self._row_s

    def _fit_row_s(self) -> float | None:
        if not self._forwards:
            return None
        n = len(self._forwards)
        sx = sum(r for r, _ in self._forwards)
        sy = sum(s for _, s in self._forwards)
        sxx = sum(r * r for r, _ in self._forwards)
        sxy = sum(r * s for r, s in self._forwards)
        spread = n * sxx - sx * sx
        if spread > 0:
            slope = (n * sxy - sx * sy) / spread
            if slope > 0:
                return float(slope)
        return float(sy / sx)
