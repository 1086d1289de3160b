"""A cluster's replica failures (`cluster.faults`): when each replica goes down and comes back.

`cluster.faults` is a list of events, each `{replica: I, down_at_s: T, up_at_s: U}` (`up_at_s`
null or left out: it never comes back). Read as outages, they are checked once, before the
run, each mistake one line naming the field: a replica in range, times in order, no two
outages of one replica overlapping, and some replica up for good after the last of them
(else the requests arriving then could never be served).

The cluster replays them on its time axis (`framework.cluster.group`): a replica fails at
the end of the step it is running at `down_at_s` (a step is the simulator's unit of work;
an idle replica fails at `down_at_s` itself), and comes back empty at `up_at_s`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Outage:
    """One replica down from `down_at_s` until `up_at_s` (None: for good), as configured."""

    replica: int
    down_at_s: float
    up_at_s: float | None = None


@dataclass
class OutageRecord:
    """An outage as it happened: when the replica really went down (the end of its step in
    flight), when it came back (None: not within the run), and what it held then."""

    replica: int
    down_s: float
    up_s: float | None
    requests_lost: int  # unfinished requests it held, sent back to the router
    # Whether the replica's books (steps, counters) outlived it: on one virtual clock they
    # do; a Ray actor's die with it, and the figures counted in them are then unknown.
    books_kept: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(event: Mapping[str, Any], key: str, where: str) -> float | None:
    value = event.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}.{key} must be a number of seconds >= 0; got {value!r}")
    return float(value)


def parse_outages(raw: Any, replicas: int) -> list[Outage]:
    """`cluster.faults` as outages, in order of their start; a mistake is one line."""
    if raw is None:
        return []
    if isinstance(raw, str | bytes) or not hasattr(raw, "__iter__"):
        raise ValueError(
            "cluster.faults must be a list of {replica: I, down_at_s: T, up_at_s: U}; "
            f"got {raw!r}"
        )
    outages: list[Outage] = []
    for n, event in enumerate(raw):
        where = f"cluster.faults[{n}]"
        if not isinstance(event, Mapping):
            shape = "{replica: I, down_at_s: T, up_at_s: U}"
            raise ValueError(f"{where} must be {shape}; got {event!r}")
        unknown = sorted(set(event) - {"replica", "down_at_s", "up_at_s"})
        if unknown:
            raise ValueError(
                f"{where} has unknown keys {unknown}: it takes replica, down_at_s, up_at_s"
            )
        replica = event.get("replica")
        if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < replicas:
            raise ValueError(
                f"{where}.replica must be a replica index 0..{replicas - 1}; got {replica!r}"
            )
        down = _number(event, "down_at_s", where)
        if down is None:
            raise ValueError(f"{where}.down_at_s is missing: when the replica goes down (s)")
        up = _number(event, "up_at_s", where)
        if up is not None and up <= down:
            raise ValueError(f"{where}.up_at_s must be after down_at_s ({down}); got {up}")
        outages.append(Outage(replica, down, up))
    outages.sort(key=lambda o: (o.down_at_s, o.replica))
    last_up: dict[int, float | None] = {}
    for o in outages:
        if o.replica in last_up:
            before = last_up[o.replica]
            if before is None or before > o.down_at_s:
                raise ValueError(
                    f"cluster.faults: replica {o.replica}'s outages overlap (one from "
                    f"{o.down_at_s} s while it is down)"
                )
        last_up[o.replica] = o.up_at_s
    gone = [r for r, up in last_up.items() if up is None]
    if outages and len(gone) == replicas:
        raise ValueError(
            "cluster.faults take every replica down for good: the requests arriving after "
            "the last failure could never be served (give one an up_at_s)"
        )
    return outages
