"""The project's one fork pool: results in order (or as done, with their index), closures and
unpicklable state read in place, fresh processes on request, and a map inside a worker run
in that worker."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from framework.run import workers
from framework.run.workers import cores, fork_map, fork_map_as_done

forks = pytest.mark.skipif(sys.platform != "linux" or cores() < 2, reason="needs 2 cores, fork")


def test_one_worker_runs_here_in_order() -> None:
    here = os.getpid()
    assert list(fork_map(lambda x: (x * 2, os.getpid()), [3, 1, 2], 1)) == [
        (6, here),
        (2, here),
        (4, here),
    ]


@forks
def test_workers_read_closures_in_place_and_keep_the_order() -> None:
    lock = threading.Lock()  # does not pickle: the workers read it in place
    items = list(range(12))
    out = list(fork_map(lambda x: (x * x, lock is not None, os.getpid()), items, 2))
    assert [o[0] for o in out] == [x * x for x in items] and all(o[1] for o in out)
    assert os.getpid() not in {o[2] for o in out}
    done = dict(fork_map_as_done(lambda x: -x, items, 2))
    assert done == {i: -x for i, x in enumerate(items)}
    assert not workers._maps  # nothing left behind for the next map


@forks
def test_fresh_gives_each_item_a_process_and_a_nested_map_stays_in_its_worker() -> None:
    pids = list(fork_map(lambda _: os.getpid(), range(4), 2, fresh=True))
    assert len(set(pids)) == 4

    def inner(_: int) -> tuple[int, list[int]]:
        return cores(), list(fork_map(lambda _: os.getpid(), range(3), 2))

    for count, nested in fork_map(inner, range(2), 2):
        assert count == 1 and len(set(nested)) == 1
