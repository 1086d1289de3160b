"""The run's steps, one row of numbers a step, spilled to a temporary file as the run goes.

A whole day's trace is a million steps, and a cluster's replicas each add theirs. Held as
`StepStats` objects (each with a dict of phase seconds) a million steps took about 1 GB of
memory; here a step is one row of `STEP_COLUMNS` float64s (272 bytes), and only the newest
`CHUNK_ROWS` rows stay in memory: the older ones go to an anonymous temporary file, from which
they are read back a chunk at a time to write `steps.csv`, sum a column or draw a plot.

It reads like the list it replaces (`len`, `log[-1]`, slices, iteration give `StepStats`), so
an observer, a study or a test uses it as before; `chunks` and `column` are the fast paths.
Every count is an integer below 2**53, so a float64 holds it exactly, and a step read back
equals the step appended (its `phase_s` has every phase, 0.0 where none was timed).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any, overload

import numpy as np

from framework.core.step_stats import PHASES, STEP_COLUMNS, StepStats

CHUNK_ROWS = 16_384  # rows held in memory before they go to the file (3.8 MB)
WIDTH = len(STEP_COLUMNS)
_FIELDS = len(STEP_COLUMNS) - len(PHASES)  # StepStats' own fields, before the phase seconds
_ROW_BYTES = WIDTH * 8
# The columns that hold counts (written as integers): all but the seconds and the window.
INT_COLUMNS = tuple(
    i for i, c in enumerate(STEP_COLUMNS) if c not in ("time", "window") and not c.endswith("_s")
)


class StepLog(Sequence[StepStats]):
    """The steps of one run (or of a cluster's replicas, merged): see the module's note."""

    def __init__(self, chunk_rows: int = CHUNK_ROWS) -> None:
        self._chunk = chunk_rows
        self._buf = np.empty((chunk_rows, WIDTH), np.float64)
        self._held = 0  # rows in `_buf`
        self._spilled = 0  # rows in the file
        self._file: IO[bytes] | None = None
        self._last: StepStats | None = None  # the newest step as appended, for the planner

    @classmethod
    def of(cls, steps: Iterable[StepStats]) -> StepLog:
        """A log of `steps` (a list of them, say, or another log)."""
        if isinstance(steps, StepLog):
            return steps
        log = cls()
        for st in steps:
            log.append(st)
        return log

    # ---- writing ---------------------------------------------------------------------
    def append(self, stats: StepStats) -> None:
        self._buf[self._held] = stats.values()
        self._held += 1
        self._last = stats
        if self._held == self._chunk:
            self._spill()

    def extend_rows(self, rows: np.ndarray) -> None:
        """Append whole rows (`STEP_COLUMNS` order), as a merge of other logs does."""
        start = 0
        while start < len(rows):
            take = min(self._chunk - self._held, len(rows) - start)
            self._buf[self._held : self._held + take] = rows[start : start + take]
            self._held += take
            start += take
            if self._held == self._chunk:
                self._spill()
        self._last = None

    def set_phases(self, k: int, phases: dict[str, float]) -> None:
        """Step `k`'s seconds of the named phases, known only after it was appended (its
        device time, read when its tokens were drained): written where the row lies, in
        memory or in the file."""
        n = len(self)
        if not 0 <= k < n:
            raise IndexError(f"step {k} of {n}")
        if k == n - 1 and self._last is not None:
            self._last.phase_s.update(phases)
        for name, seconds in phases.items():
            col = _FIELDS + PHASES.index(name)
            if k >= self._spilled:
                self._buf[k - self._spilled, col] = seconds
            else:
                assert self._file is not None
                value = np.float64(seconds).tobytes()
                os.pwrite(self._file.fileno(), value, (k * WIDTH + col) * 8)

    def _spill(self) -> None:
        if self._file is None:
            # It lives as long as the log; the system deletes it when it is closed or
            # the process ends.
            self._file = tempfile.TemporaryFile(prefix="nanoserve-steps-")  # noqa: SIM115
        self._file.seek(self._spilled * _ROW_BYTES)
        self._file.write(self._buf[: self._held].tobytes())
        self._file.flush()
        self._spilled += self._held
        self._held = 0

    # ---- reading ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._spilled + self._held

    def rows(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """Rows `start..end-1` as a new array. Safe in a forked process: the file is read
        with `pread`, which moves no shared offset."""
        n = len(self)
        end = n if end is None else min(end, n)
        start = max(0, start)
        if end <= start:
            return np.empty((0, WIDTH), np.float64)
        parts = []
        if start < self._spilled:
            assert self._file is not None
            stop = min(end, self._spilled)
            data = os.pread(self._file.fileno(), (stop - start) * _ROW_BYTES, start * _ROW_BYTES)
            parts.append(np.frombuffer(data, np.float64).reshape(-1, WIDTH))
        if end > self._spilled:
            lo = max(start, self._spilled) - self._spilled
            parts.append(self._buf[lo : end - self._spilled].copy())
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def chunks(self, start: int = 0, end: int | None = None) -> Iterator[np.ndarray]:
        """Rows `start..end-1` a chunk at a time, so no more than a chunk is read at once."""
        end = len(self) if end is None else min(end, len(self))
        for lo in range(start, end, self._chunk):
            yield self.rows(lo, min(lo + self._chunk, end))

    def column(self, name: str) -> np.ndarray:
        """One column of every step, as float64 (`STEP_COLUMNS` names it)."""
        at = STEP_COLUMNS.index(name)
        out = np.empty(len(self), np.float64)
        done = 0
        for rows in self.chunks():
            out[done : done + len(rows)] = rows[:, at]
            done += len(rows)
        return out

    @overload
    def __getitem__(self, i: int) -> StepStats: ...
    @overload
    def __getitem__(self, i: slice) -> list[StepStats]: ...
    def __getitem__(self, i: int | slice) -> StepStats | list[StepStats]:
        n = len(self)
        if isinstance(i, slice):
            start, stop, stride = i.indices(n)
            if stride != 1:
                return [self[k] for k in range(start, stop, stride)]
            return [stats_of(r) for r in self.rows(start, stop)]
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(f"step {i} of {n}")
        if k == n - 1 and self._last is not None:
            return self._last
        return stats_of(self.rows(k, k + 1)[0])

    def __iter__(self) -> Iterator[StepStats]:
        for rows in self.chunks():
            yield from (stats_of(r) for r in rows)

    def __bool__(self) -> bool:
        return len(self) > 0

    # ---- a log sent to another process (a Ray replica's result) ----------------------
    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_rows, (self.rows(),))


def _from_rows(rows: np.ndarray) -> StepLog:
    log = StepLog()
    log.extend_rows(rows)
    return log


def stats_of(row: np.ndarray) -> StepStats:
    """One row back as a `StepStats`, its counts as ints."""
    values = row.tolist()
    for i in INT_COLUMNS:
        values[i] = int(values[i])
    phases = dict(zip(PHASES, values[_FIELDS:], strict=True))
    return StepStats(*values[:_FIELDS], phase_s=phases)  # type: ignore[misc]  # _FIELDS: the rest


def merged(logs: Sequence[StepLog]) -> tuple[StepLog, list[int]]:
    """The logs' steps in time order (ties: the lower log first, then each log's own
    order), and each step's log: a cluster's steps. Read and written a chunk at a time."""
    times = [log.column("time") for log in logs]
    which = np.concatenate([np.full(len(t), i, np.int32) for i, t in enumerate(times)])
    local = np.concatenate([np.arange(len(t), dtype=np.int64) for t in times])
    order = np.lexsort((local, which, np.concatenate(times) if times else np.empty(0)))
    which, local = which[order], local[order]
    del times, order
    out = StepLog()
    for lo in range(0, len(which), CHUNK_ROWS):
        w, k = which[lo : lo + CHUNK_ROWS], local[lo : lo + CHUNK_ROWS]
        rows = np.empty((len(w), WIDTH), np.float64)
        for i, log in enumerate(logs):
            mine = w == i
            if mine.any():  # each log's steps in a chunk are consecutive, in order
                ks = k[mine]
                rows[mine] = log.rows(int(ks[0]), int(ks[-1]) + 1)
        out.extend_rows(rows)
    return out, which.tolist()
