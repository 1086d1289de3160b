"""steps.csv: one row a step, formatted on every core the run may use when the run is long.

A whole day's trace under the simulated executor is a million steps, and a row is 29
numbers, 13 of them floats written to their shortest exact text: formatting them on one core
is the largest cost of the command after the engine (docs/measurements/code-notes.md).
The steps come from the run's `StepLog` a chunk at a time (most of them from its file on
disk), so writing holds no more than a few chunks of rows in memory. Past `PARALLEL_STEPS`
steps the chunks are formatted by forked workers (`framework/run/forked.py`), which read the
log's file themselves. The text is the same either way, and the same `csv.writer` writes;
`path` ending in `.gz` writes it gzipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from framework.core.step_stats import STEP_COLUMNS, StepStats
from framework.engine.step_log import CHUNK_ROWS, INT_COLUMNS, StepLog
from framework.run.forked import chunked, encoded, in_order

# One row: every cell a number, so no quoting; the csv module's line ending.
STEP_ROW = ",".join(["%s"] * len(STEP_COLUMNS)) + "\r\n"
PARALLEL_STEPS = 200_000  # fewer: one process (a fork and its workers cost more than they save)
CHUNK_STEPS = CHUNK_ROWS  # rows formatted at a time, by this process or a worker (about 5 MB)

_log: StepLog | None = None  # the log being written, for the forked workers to read
_replicas: np.ndarray | None = None
_gzip = False  # whether each chunk is gzipped where it is formatted


def write_steps(
    path: Path,
    steps: Sequence[StepStats],
    parallel_steps: int = PARALLEL_STEPS,
    replicas: Sequence[int] | None = None,
) -> None:
    """steps.csv, header and one row a step (nothing at all for a run without steps). A
    cluster's steps (`replicas`: each step's replica) end in a `replica` column. Gzipped,
    each chunk is a gzip member of its own, compressed where it was formatted (a file of
    several members is one gzip file to every reader)."""
    global _log, _replicas, _gzip
    log = StepLog.of(steps)
    with path.open("wb") as f:
        if not len(log):
            if path.suffix == ".gz":
                f.write(encoded("", True))
            return
        header = (*STEP_COLUMNS, "replica") if replicas is not None else STEP_COLUMNS
        _log, _replicas = log, None if replicas is None else np.asarray(replicas, np.int64)
        _gzip = path.suffix == ".gz"
        try:
            f.write(encoded(",".join(header) + "\r\n", _gzip))
            ranges = chunked(len(log), CHUNK_STEPS)
            f.writelines(in_order(_format_chunk, ranges, len(log) >= parallel_steps))
        finally:
            _log = _replicas = None
            _gzip = False


def _format_chunk(bounds: tuple[int, int]) -> bytes:
    """Steps `start..end-1` as text (gzipped where the file is): counts as integers, seconds
    as their shortest text."""
    assert _log is not None
    start, end = bounds
    rows = _log.rows(start, end)
    columns: list[list[object]] = [rows[:, i].tolist() for i in range(rows.shape[1])]
    for i in INT_COLUMNS:
        columns[i] = rows[:, i].astype(np.int64).tolist()
    row = STEP_ROW
    if _replicas is not None:
        columns.append(_replicas[start:end].tolist())
        row = STEP_ROW[:-2] + ",%s\r\n"
    return encoded("".join([row % cells for cells in zip(*columns, strict=True)]), _gzip)
