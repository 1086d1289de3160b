"""The step log: what goes in comes back (from memory and from its file alike), a cluster's
logs merge in time order, and a log crosses a process boundary whole."""

from __future__ import annotations

import csv
import gzip
import heapq
import io
import pickle
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from framework.core.step_stats import PHASES, STEP_COLUMNS, StepStats, step_value
from framework.engine.step_log import StepLog, merged
from framework.run import steps_csv
from framework.run.steps_csv import write_steps

_ints = st.integers(0, 2**40)
_secs = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def steps(draw: st.DrawFn, n: int | None = None) -> list[StepStats]:
    count = draw(st.integers(0, 40)) if n is None else n
    out = []
    time = 0.0
    for i in range(count):
        time += draw(_secs)
        phases = draw(st.dictionaries(st.sampled_from(PHASES), _secs, max_size=len(PHASES)))
        ints = [draw(_ints) for _ in range(16)]
        out.append(StepStats(i, time, *ints, draw(_secs), phase_s=phases))
    return out


def same(a: StepStats, b: StepStats) -> bool:
    return all(step_value(a, c) == step_value(b, c) for c in STEP_COLUMNS)


@settings(max_examples=40, deadline=None)
@given(steps(), st.integers(1, 7))
def test_what_goes_in_comes_back(stats: list[StepStats], chunk: int) -> None:
    """Through memory and the file alike (a chunk of a few rows spills often): each step,
    slices, the newest, a column, and a pickled copy."""
    log = StepLog(chunk_rows=chunk)
    for s in stats:
        log.append(s)
    assert len(log) == len(stats) and bool(log) == bool(stats)
    assert all(same(a, b) for a, b in zip(log, stats, strict=True))
    assert all(same(log[i], stats[i]) for i in range(-len(stats), len(stats)))
    assert all(same(a, b) for a, b in zip(log[1:-1], stats[1:-1], strict=True))
    assert log.column("time").tolist() == [s.time for s in stats]
    assert log.column("rows").tolist() == [s.rows for s in stats]
    copy = pickle.loads(pickle.dumps(log))
    assert all(same(a, b) for a, b in zip(copy, stats, strict=True)) and len(copy) == len(stats)
    if stats:  # read back (not the newest as appended): ints, and every phase
        first = next(iter(log))
        assert type(first.rows) is int and set(first.phase_s) == set(PHASES)


@settings(max_examples=30, deadline=None)
@given(st.lists(steps(), min_size=1, max_size=4))
def test_a_clusters_logs_merge_in_time_order(parts: list[list[StepStats]]) -> None:
    """As `heapq.merge` on (time, replica, index) would: ties go to the lower replica."""
    logs = [StepLog(chunk_rows=3) for _ in parts]
    for log, stats in zip(logs, parts, strict=True):
        for s in stats:
            log.append(s)
    out, which = merged(logs)
    want = list(
        heapq.merge(*([(s.time, i, k) for k, s in enumerate(p)] for i, p in enumerate(parts)))
    )
    assert which == [i for _, i, _ in want]
    assert all(same(a, parts[i][k]) for a, (_, i, k) in zip(out, want, strict=True))


@settings(max_examples=15, deadline=None)
@given(steps(n=23))
def test_steps_csv_gzipped_is_the_same_text(stats: list[StepStats]) -> None:
    """A long run's steps.csv.gz holds exactly the text of steps.csv, chunk by chunk."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        steps_csv.CHUNK_STEPS, kept = 5, steps_csv.CHUNK_STEPS
        try:
            write_steps(folder / "steps.csv", stats)
            write_steps(folder / "steps.csv.gz", stats)
        finally:
            steps_csv.CHUNK_STEPS = kept
        plain = (folder / "steps.csv").read_bytes()
        assert gzip.decompress((folder / "steps.csv.gz").read_bytes()) == plain
    theirs = io.StringIO(newline="")
    w = csv.writer(theirs)
    w.writerow(STEP_COLUMNS)
    w.writerows(s.values() for s in stats)
    assert plain.decode() == theirs.getvalue()
