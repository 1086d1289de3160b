"""The MLflow per-step series stay bounded and still add up (framework/tracking/series.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framework.tracking.series import StepSeries

STEP = st.tuples(
    st.integers(0, 64),  # rows
    st.integers(0, 64),  # tokens kept
    st.integers(0, 500),  # blocks in use
    st.sampled_from([0.0, 1.0, 4.0]),  # window
    st.integers(0, 1000),  # waiting
)


def fill(steps: list[tuple[int, int, int, float, int]], max_points: int) -> dict[str, list]:
    series = StepSeries(max_points)
    for i, (rows, kept, blocks, window, waiting) in enumerate(steps):
        series.add(i, 1000 + 10 * i, rows, min(kept, rows), blocks, window, waiting)
    out: dict[str, list] = {}
    for key, value, t, step in series.points():
        out.setdefault(key, []).append((step, value, t))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=600), st.integers(2, 40))
def test_bounded_covering_and_conserving(steps: list, max_points: int) -> None:
    got = fill(steps, max_points)
    n = len(steps)
    for key, points in got.items():
        at = [s for s, _, _ in points]
        assert len(points) <= max_points, key
        assert at == sorted(set(at)) and at[-1] == n - 1, key  # the whole run, in order
        assert [t for _, _, t in points] == [1000 + 10 * s for s in at]  # the step's own time
    at = [s for s, _, _ in got["step.rows"]]
    sizes = [b - a for a, b in zip([-1, *at], at, strict=False)]  # steps each point pools
    for key, field in (("step.rows", 0), ("step.blocks_in_use", 2), ("step.waiting", 4)):
        means = [v for _, v, _ in got[key]]
        total = sum(s[field] for s in steps)
        assert sum(m * k for m, k in zip(means, sizes, strict=True)) == pytest.approx(total)
    rows = sum(s[0] for s in steps)
    kept = sum(min(s[1], s[0]) for s in steps)
    waste = got["step.waste_so_far"][-1][1]
    assert waste == pytest.approx(1 - kept / rows if rows else 0.0)  # = the run's waste


def test_exact_up_to_the_limit_then_about_half_to_the_whole_limit() -> None:
    steps = [(i % 7, 0, i, 1.0, 3) for i in range(100)]
    exact = fill(steps, 100)
    assert [v for _, v, _ in exact["step.blocks_in_use"]] == [float(i) for i in range(100)]
    pooled = fill(steps * 10, 100)  # 1000 steps: buckets of 16
    assert 50 <= len(pooled["step.rows"]) <= 100
    assert all(v == 1.0 for _, v, _ in pooled["step.window"])


def test_max_points_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mlflow\.max_step_points must be >= 2"):
        StepSeries(1)
