"""The measured costs output policies read (`framework/engine/costs.py`): kept up to date as
observations arrive, they must equal the estimates taken afresh over the last `history`
observations: the median readback, and the least-squares slope of forward seconds over rows
(the mean seconds per row when every forward had the same width)."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from framework.engine.costs import PS, MeasuredCosts

seconds = st.floats(1e-6, 1.0, allow_nan=False)


def fresh_slope(points: list[tuple[int, float]]) -> float:
    """The slope over `points` from scratch (in picoseconds, as the model sums them)."""
    points = [(r, round(s * PS)) for r, s in points]
    n = len(points)
    sx = sum(r for r, _ in points)
    sy = sum(s for _, s in points)
    spread = n * sum(r * r for r, _ in points) - sx * sx
    if spread > 0:
        slope = (n * sum(r * s for r, s in points) - sx * sy) / spread
        if slope > 0:
            return slope / PS
    return sy / sx / PS


@given(
    history=st.integers(1, 8),
    forwards=st.lists(st.tuples(st.integers(1, 128), seconds), max_size=40),
    transfers=st.lists(seconds, max_size=40),
)
def test_estimates_are_those_of_the_last_observations(
    history: int, forwards: list[tuple[int, float]], transfers: list[float]
) -> None:
    costs = MeasuredCosts(history)
    assert costs.row_s is None and costs.transfer_s is None  # nothing measured yet
    for i, (rows, secs) in enumerate(forwards):
        costs.observe_forward(rows, secs)
        want = fresh_slope(forwards[max(0, i + 1 - history) : i + 1])
        assert costs.row_s == want  # exact: the sums are integers, never drifting
    for i, secs in enumerate(transfers):
        costs.observe_transfer(secs)
        assert costs.transfer_s == statistics.median(transfers[max(0, i + 1 - history) : i + 1])
