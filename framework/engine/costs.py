"""Measured costs that output policies may use: one host readback, one more decode row.

Seconds describe this machine only; they feed decisions, never reported counts.
"""

from __future__ import annotations

import bisect
from collections import deque

PS = 10**12  # forward seconds are summed in whole picoseconds


class MeasuredCosts:
    """This run's measured costs, where the simulator's `CostModel` predicts them. Estimates
    over the last `history` observations, each kept up to date in O(1) (a
    sorted copy for the median, running sums for the slope) as observations arrive: they are
    read every step, and recomputing them over the whole window was 2-3% of a simulated
    step's host work at trace scale."""

    def __init__(self, history: int = 64) -> None:
        self._forwards: deque[tuple[int, int]] = deque(maxlen=history)  # (rows, picoseconds)
        self._transfers: deque[float] = deque(maxlen=history)
        self._sorted_transfers: list[float] = []
        # Sums over `_forwards` for the least-squares slope, all exact integers (seconds in
        # whole picoseconds), so that adding points as they enter and subtracting them as
        # they leave never drifts from the sums taken afresh.
        self._sx = self._sxx = self._sy = self._sxy = 0

    def observe_forward(self, decode_rows: int, seconds: float) -> None:
        """A decode-only forward: its row count and time (prefill steps would skew the slope)."""
        if len(self._forwards) == self._forwards.maxlen:
            r, ps = self._forwards[0]
            self._sx -= r
            self._sxx -= r * r
            self._sy -= ps
            self._sxy -= r * ps
        ps = round(seconds * PS)
        self._forwards.append((decode_rows, ps))
        self._sx += decode_rows
        self._sxx += decode_rows * decode_rows
        self._sy += ps
        self._sxy += decode_rows * ps

    def observe_transfer(self, seconds: float) -> None:
        ordered = self._sorted_transfers
        if len(self._transfers) == self._transfers.maxlen:
            del ordered[bisect.bisect_left(ordered, self._transfers[0])]
        self._transfers.append(seconds)
        bisect.insort(ordered, seconds)

    @property
    def transfer_s(self) -> float | None:
        """The median of the observed readbacks (as `statistics.median` takes it)."""
        ordered = self._sorted_transfers
        n = len(ordered)
        if not n:
            return None
        mid = n // 2
        return float(ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2)

    @property
    def row_s(self) -> float | None:
        """Marginal seconds per decode row: the least-squares slope of forward time over rows,
        or the mean time per row while every forward had the same width."""
        n = len(self._forwards)
        if not n:
            return None
        spread = n * self._sxx - self._sx * self._sx
        if spread > 0:
            rise = n * self._sxy - self._sx * self._sy
            if rise > 0:
                return rise / spread / PS
        return self._sy / self._sx / PS
