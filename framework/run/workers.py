"""The project's one pool of forked worker processes: a function mapped over items, in order or
as each finishes, by every part of nanoserve that runs work side by side (a run folder's
chunks, a reproduction's jobs and searches, a goodput study's searches).

Why forked, and why like this:

- the workers are forked (Linux only: fork without exec is unsafe on macOS, absent on
  Windows), so they read the parent's state in place: the function and its items are set in a
  module global before the fork and each worker is sent only an item's index, so neither has
  to pickle (a closure, a loaded model, a built workload all work); only results come back;
- the heap is frozen first (`gc.freeze`), so that a collection in a worker does not touch, and
  so copy, every page of it;
- stdout and stderr are flushed first: a worker inherits the unflushed output and flushes it
  as it exits, so it would be said twice;
- inside a worker the map runs in that process: a pool's workers cannot fork pools of their
  own, and the cores are taken already;
- `fresh=True` gives each item a process of its own, so a job that holds gigabytes gives
  them back when it ends.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# What the workers read in place, by map: set before they fork, removed when the map ends.
_maps: dict[int, tuple[Callable[[Any], Any], Sequence[Any]]] = {}
_ids = itertools.count()
_in_worker = False


def cores() -> int:
    """The cores this process may run on, where workers can be forked (1 where they cannot,
    or inside a worker)."""
    if sys.platform != "linux" or _in_worker:
        return 1
    return len(os.sched_getaffinity(0))


def fork_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int, *, fresh: bool = False
) -> Iterator[R]:
    """`fn` of each item, in the items' order, `workers` at a time in forked processes (here,
    one by one, when fewer than two can run)."""
    for _, result in _mapped(fn, items, workers, fresh, ordered=True):
        yield result


def fork_map_as_done(
    fn: Callable[[T], R], items: Sequence[T], workers: int, *, fresh: bool = False
) -> Iterator[tuple[int, R]]:
    """(index, `fn` of item index) as each finishes: for a caller that reports progress."""
    yield from _mapped(fn, items, workers, fresh, ordered=False)


def _mapped(
    fn: Callable[[Any], Any], items: Sequence[Any], workers: int, fresh: bool, ordered: bool
) -> Iterator[tuple[int, Any]]:
    count = min(workers, cores(), len(items))
    if count < 2:
        yield from ((i, fn(item)) for i, item in enumerate(items))
        return
    key = next(_ids)
    _maps[key] = (fn, items)
    sys.stdout.flush()
    sys.stderr.flush()
    frozen_here = not gc.get_freeze_count()
    if frozen_here:
        gc.freeze()
    try:
        context = multiprocessing.get_context("fork")
        with context.Pool(count, _enter_worker, maxtasksperchild=1 if fresh else None) as pool:
            tasks = [(key, i) for i in range(len(items))]
            yield from (pool.imap if ordered else pool.imap_unordered)(_call, tasks)
    finally:
        if frozen_here:
            gc.unfreeze()
        del _maps[key]


def _enter_worker() -> None:
    global _in_worker
    _in_worker = True


def _call(task: tuple[int, int]) -> tuple[int, Any]:
    """Item `index` of map `key`, in a worker: the function and items read in place."""
    key, index = task
    fn, items = _maps[key]
    return index, fn(items[index])
