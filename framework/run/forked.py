"""Chunks of a long run's results formatted by forked worker processes, in order.

Writing a trace-scale run folder is mostly formatting numbers as text (and gzipping it), one
chunk at a time, and the chunks are independent: on a machine with more than one core that
can fork (Linux), workers format them in parallel and this process writes them in order. The
workers are forked, so they read the run's results in place (nothing is pickled to them but
the chunk's bounds): `framework.run.workers`, the project's one pool.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator

from framework.run.workers import cores, fork_map

MAX_WORKERS = 8
GZIP_LEVEL = 1  # about 2-3x smaller than the text, at a fraction of the default level's time
Bounds = tuple[int, int]


def encoded(text: str, gz: bool) -> bytes:
    """A chunk's text as bytes, as a gzip member of its own when `gz` (a file of several
    members is one gzip file to every reader: gzip, zcat, pandas, numpy)."""
    data = text.encode()
    return gzip.compress(data, GZIP_LEVEL, mtime=0) if gz else data


def workers() -> int:
    """The cores this process may run on, where worker processes can be forked (at most
    `MAX_WORKERS`: past it the writer, not the formatting, is the bound)."""
    return min(cores(), MAX_WORKERS)


def chunked(n: int, size: int) -> list[Bounds]:
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def in_order(
    fn: Callable[[Bounds], bytes], ranges: list[Bounds], parallel: bool
) -> Iterator[bytes]:
    """`fn` of each range, in order: in forked workers when `parallel` and there are cores
    for them, else here. The workers read what `fn` formats in place (forked)."""
    yield from fork_map(fn, ranges, workers() if parallel else 1)
