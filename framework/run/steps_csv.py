"""steps.csv: one row a step, formatted on every core the run may use when the run is long.

A whole day's trace under the simulated executor is a million steps, and a row is 29
numbers, 13 of them floats written to their shortest exact text: formatting them on one core
is the largest cost of the command after the engine (docs/measurements/code-notes.md).
Past `PARALLEL_STEPS` steps, where the machine has more than one core and can fork
(Linux), worker processes format chunks of the rows in parallel and this process writes
them in order. The workers are forked, so they read the run's steps in place (nothing is
pickled to them); the heap is frozen first (`gc.freeze`), so that a collection in a worker
does not touch, and so copy, every page of it. The file is the same bytes either way, and
the same bytes `csv.writer` writes.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from framework.engine.counters import STEP_COLUMNS, StepStats

# One row: every cell a number, so no quoting; the csv module's line ending. One `%` a row
# is 1.38x the csv module's cell-by-cell writing (same machine).
STEP_ROW = ",".join(["%s"] * len(STEP_COLUMNS)) + "\r\n"
PARALLEL_STEPS = 200_000  # fewer: one process (a fork and its workers cost more than they save)
CHUNK_STEPS = 50_000  # rows a worker formats at a time (about 14 MB of text)
MAX_WORKERS = 8

_steps: list[StepStats] = []  # the rows being written, for the forked workers to read


def write_steps(
    path: Path,
    steps: list[StepStats],
    parallel_steps: int = PARALLEL_STEPS,
    replicas: list[int] | None = None,
) -> None:
    """steps.csv, header and one row a step (nothing at all for a run without steps). A
    cluster's steps (`replicas`: each step's replica) end in a `replica` column."""
    with path.open("w", newline="") as f:
        if not steps:
            return
        if replicas is not None:
            f.write(",".join((*STEP_COLUMNS, "replica")) + "\r\n")
            row = STEP_ROW[:-2]
            f.writelines(
                f"{row % st.values()},{r}\r\n" for st, r in zip(steps, replicas, strict=True)
            )
            return
        f.write(",".join(STEP_COLUMNS) + "\r\n")
        workers = _workers() if len(steps) >= parallel_steps else 1
        if workers < 2:
            row = STEP_ROW
            f.writelines(row % st.values() for st in steps)
        else:
            f.writelines(_formatted_in_parallel(steps, workers))


def _workers() -> int:
    """The cores this process may run on, where worker processes can be forked."""
    if sys.platform != "linux":  # fork without exec is unsafe on macOS, absent on Windows
        return 1
    return min(len(os.sched_getaffinity(0)), MAX_WORKERS)


def _formatted_in_parallel(steps: list[StepStats], workers: int) -> Iterator[str]:
    """The rows' text, chunk by chunk in order, formatted by `workers` forked processes."""
    global _steps
    chunks = [(i, min(i + CHUNK_STEPS, len(steps))) for i in range(0, len(steps), CHUNK_STEPS)]
    # A worker inherits this process's unflushed output and flushes it as it exits: said
    # twice. And the heap is frozen while they run (see the module's note).
    sys.stdout.flush()
    sys.stderr.flush()
    frozen_here = not gc.get_freeze_count()
    if frozen_here:
        gc.freeze()
    _steps = steps
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            yield from pool.imap(_format_chunk, chunks)
    finally:
        _steps = []
        if frozen_here:
            gc.unfreeze()


def _format_chunk(bounds: tuple[int, int]) -> str:
    """In a worker: the rows of steps `start..end-1`, as one string."""
    start, end = bounds
    row = STEP_ROW
    return "".join([row % st.values() for st in _steps[start:end]])
