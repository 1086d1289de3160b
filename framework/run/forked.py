"""Chunks of a long run's results formatted by forked worker processes, in order.

Writing a trace-scale run folder is mostly formatting numbers as text (and gzipping it), one
chunk at a time, and the chunks are independent: on a machine with more than one core that
can fork (Linux), workers format them in parallel and this process writes them in order. The
workers are forked, so they read the run's results in place (nothing is pickled to them but
the chunk's bounds); the heap is frozen first (`gc.freeze`), so that a collection in a
worker does not touch, and so copy, every page of it.
"""

from __future__ import annotations

import gc
import gzip
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator

MAX_WORKERS = 8
GZIP_LEVEL = 1  # about 2-3x smaller than the text, at a fraction of the default level's time
Bounds = tuple[int, int]


def encoded(text: str, gz: bool) -> bytes:
    """A chunk's text as bytes, as a gzip member of its own when `gz` (a file of several
    members is one gzip file to every reader: gzip, zcat, pandas, numpy)."""
    data = text.encode()
    return gzip.compress(data, GZIP_LEVEL, mtime=0) if gz else data


def workers() -> int:
    """The cores this process may run on, where worker processes can be forked."""
    if sys.platform != "linux":  # fork without exec is unsafe on macOS, absent on Windows
        return 1
    return min(len(os.sched_getaffinity(0)), MAX_WORKERS)


def chunked(n: int, size: int) -> list[Bounds]:
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def in_order(
    fn: Callable[[Bounds], bytes], ranges: list[Bounds], parallel: bool
) -> Iterator[bytes]:
    """`fn` of each range, in order: in forked workers when `parallel` and there are cores
    for them, else here. `fn` must be a module-level function (a worker finds it by name)
    that reads what it formats from its module's globals, set before this is called."""
    count = workers() if parallel else 1
    if count < 2:
        yield from (fn(r) for r in ranges)
        return
    # A worker inherits this process's unflushed output and flushes it as it exits: said
    # twice. And the heap is frozen while they run (see the module's note).
    sys.stdout.flush()
    sys.stderr.flush()
    frozen_here = not gc.get_freeze_count()
    if frozen_here:
        gc.freeze()
    try:
        with multiprocessing.get_context("fork").Pool(count) as pool:
            yield from pool.imap(fn, ranges)
    finally:
        if frozen_here:
            gc.unfreeze()
