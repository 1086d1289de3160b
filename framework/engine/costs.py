"""Measured costs that output policies may use: one host readback, one more decode row.

Seconds describe this machine only; they feed decisions, never reported counts.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class CostModel:
    def __init__(self, history: int = 64) -> None:
        self._forwards: deque[tuple[int, float]] = deque(maxlen=history)
        self._transfers: deque[float] = deque(maxlen=history)

    def observe_forward(self, decode_rows: int, seconds: float) -> None:
        """A decode-only forward: its row count and time (prefill steps would skew the slope)."""
        self._forwards.append((decode_rows, seconds))

    def observe_transfer(self, seconds: float) -> None:
        self._transfers.append(seconds)

    @property
    def transfer_s(self) -> float | None:
        return float(np.median(self._transfers)) if self._transfers else None

    @property
    def row_s(self) -> float | None:
        """Marginal seconds per decode row: the slope of forward time over rows, or the mean
        time per row while every forward had the same width."""
        if not self._forwards:
            return None
        rows = np.array([r for r, _ in self._forwards], dtype=float)
        secs = np.array([s for _, s in self._forwards], dtype=float)
        if np.ptp(rows) > 0:
            slope = float(np.polyfit(rows, secs, 1)[0])
            if slope > 0:
                return slope
        return float(np.sum(secs) / np.sum(rows))
