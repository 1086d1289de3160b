"""A cluster's outages as they are replayed: the next failure or return, the replicas down,
the requests waiting for any replica at all, and the record of what happened.

The cluster (`framework.cluster.group`) asks `next_time` for the next event on its time
axis and takes it in order with the arrivals and the steps (an event first on a tie, so an
arrival at the same instant sees the cluster as it is after it). A replica's failure is
taken at the end of the step it is running at `down_at_s` (`max(down_at_s, its clock)`):
the simulator prices a step whole, so a step begun is a step done; a return at `up_at_s`,
or when its failure was taken if that is later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.cluster.outages import Outage, OutageRecord

if TYPE_CHECKING:
    from framework.core.request import RequestSpec
    from framework.core.sequence import Sequence
    from framework.engine.loop import Engine


@dataclass(frozen=True)
class Event:
    at: float  # as configured
    replica: int
    down: bool  # a failure; else a return
    outage: int  # its index in `FaultSchedule.outages`


class FaultSchedule:
    def __init__(self, outages: list[Outage], engines: list[Engine]) -> None:
        self.outages = outages
        self.engines = engines
        events = []
        for n, o in enumerate(outages):
            events.append(Event(o.down_at_s, o.replica, True, n))
            if o.up_at_s is not None:
                events.append(Event(o.up_at_s, o.replica, False, n))
        # By time; at one instant a return before a failure (a replica back at T may take
        # what one failing at T held), then by replica.
        self.events = sorted(events, key=lambda e: (e.at, e.down, e.replica))
        self._next = 0
        self.down: set[int] = set()
        self.records: list[OutageRecord] = []
        self._open: dict[int, OutageRecord] = {}  # replica -> its outage under way
        # Requests with no live replica to go to: a new arrival (its spec) or a request a
        # failed replica held (its copy), in the order they came.
        self.orphans: deque[RequestSpec | Sequence] = deque()

    def next_time(self) -> float:
        """When the next event takes effect (inf when none is left): the earliest of the
        events' effective times (a failure waits for its replica's step in flight, so a
        later one of another replica may come first), the earliest configured on a tie."""
        best, self._next = float("inf"), 0
        for n, e in enumerate(self.events):
            if e.at > best:  # sorted by `at`: none after it can be sooner
                break
            t = max(e.at, self.engines[e.replica].now())
            if t < best:
                best, self._next = t, n
        return best

    def pop(self) -> Event:
        """The event `next_time` found (call it right after)."""
        e = self.events[self._next]
        del self.events[self._next]
        return e

    def went_down(self, replica: int, at: float, lost: int) -> None:
        self.down.add(replica)
        record = OutageRecord(replica, at, None, lost)
        self.records.append(record)
        self._open[replica] = record

    def came_up(self, replica: int, at: float) -> list[RequestSpec | Sequence]:
        """`replica` is back at `at`: the requests that waited for any live replica, in the
        order they came, to be placed now."""
        self.down.discard(replica)
        self._open.pop(replica).up_s = at
        waited, self.orphans = list(self.orphans), deque()
        return waited
