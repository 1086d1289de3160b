"""The link between a cluster's replicas: KV transfers sharing its bandwidth on the virtual
clock, as a discrete-event progress model.

- Each replica has one port of the link's bandwidth (bytes/s, each way). A prefill replica
  only sends and a decode replica only receives, so a duplex link's two directions never
  meet on one port.
- A transfer uses its sender's port and its receiver's. While n transfers use a port, each
  gets 1/n of it, and a transfer's rate is the smaller of its two shares. Rates change only
  when a transfer's bytes start or finish, so between those events the model is exact: the
  cluster's event loop asks for the next one (`next_time`) and moves the link to it
  (`advance`), as it takes an arrival or a step.
- A transfer is done `latency` seconds after its last byte: the one-way latency of its
  last message. Set at the end, it keeps the ports' occupancy to the bytes, and a lone
  transfer takes exactly latency + bytes / bandwidth.
- A layer-wise transfer (`Overlap`) sends each layer's KV as the prefill computes it. Its
  bytes start to flow when the prefill ends, less what could already be sent while the
  prefill's later layers ran (`overlapped_bytes`), priced at the rate the transfer gets
  when it starts. It is never slower than the same transfer sent whole after the prefill.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Overlap:
    """The prefill a layer-wise transfer overlaps: its step's forward seconds per layer."""

    layer_s: float
    layers: int


@dataclass(eq=False)
class Transfer:
    """One request's KV from replica `src` to replica `dst`; `bytes` is what one port
    carries. The times are filled in as the link moves it."""

    src: int
    dst: int
    bytes: float
    start: float  # when it may start (its reservation is held and its KV is computed)
    overlap: Overlap | None = None
    payload: Any = None  # the caller's own: the request and where it goes
    remaining: float = 0.0  # bytes still to send, as of the link's `now`
    rate: float = 0.0  # bytes/s while it flows
    sent_before: float = 0.0  # bytes a layer-wise transfer sent during its prefill
    flow_end: float | None = None
    done_at: float | None = None
    order: int = field(default=0, repr=False)  # the link's count of sends: a tie-break


def overlapped_bytes(total: float, overlap: Overlap, rate: float) -> float:
    """Bytes of a layer-wise transfer already sent when its prefill ends: layer l's KV is
    ready `(layers - 1 - l) x layer_s` before the end, and the layers go one after another
    at `rate`. The last layer is always left (it is ready only at the end)."""
    layers = overlap.layers
    if layers < 2 or overlap.layer_s <= 0 or rate <= 0:
        return 0.0
    chunk = total / layers
    chunk_s = chunk / rate
    sent = 0.0
    free_at = float("-inf")  # when the link is done with the layers before
    for layer in range(layers):
        begin = max(free_at, -(layers - 1 - layer) * overlap.layer_s)
        if begin >= 0.0:
            break
        end = begin + chunk_s
        if end > 0.0:
            return sent + (0.0 - begin) * rate
        sent += chunk
        free_at = end
    return sent


class Link:
    """Transfers waiting to start, flowing, and past their last byte (landing)."""

    def __init__(self, bandwidth: float, latency: float) -> None:
        if not bandwidth > 0:
            raise ValueError(f"a link's bandwidth must be > 0 bytes/s; got {bandwidth}")
        if latency < 0:
            raise ValueError(f"a link's latency must be >= 0 s; got {latency}")
        self.bandwidth = bandwidth
        self.latency = latency
        self.now = 0.0
        self._count = itertools.count()
        self._starting: list[tuple[float, int, Transfer]] = []
        self._flowing: list[Transfer] = []
        self._landing: list[tuple[float, int, Transfer]] = []

    @property
    def busy(self) -> bool:
        return bool(self._starting or self._flowing or self._landing)

    def send(self, t: Transfer) -> None:
        """`t` starts at `t.start`, which is not before any event the link has taken."""
        if t.start < self.now:
            raise ValueError(f"a transfer starting at {t.start} is before the link's {self.now}")
        if t.bytes < 0:
            raise ValueError(f"a transfer of {t.bytes} bytes")
        t.order = next(self._count)
        t.remaining = t.bytes
        heapq.heappush(self._starting, (t.start, t.order, t))

    def next_time(self) -> float:
        """When the link's next event happens (inf when it has none)."""
        best = float("inf")
        if self._starting:
            best = self._starting[0][0]
        if self._landing:
            best = min(best, self._landing[0][0])
        for t in self._flowing:
            best = min(best, self._end(t))
        return best

    def _end(self, t: Transfer) -> float:
        return self.now + t.remaining / t.rate if t.remaining > 0 else self.now

    def advance(self, until: float) -> list[Transfer]:
        """Move to `until` (at most `next_time()`): bytes flow at the rates in force, the
        transfers whose bytes end, start or land at `until` do. Returns those done."""
        if until < self.now:
            raise ValueError(f"the link cannot go back from {self.now} to {until}")
        if until > self.next_time():
            raise ValueError(f"the link would skip its event at {self.next_time()}")
        ends = {t: self._end(t) for t in self._flowing}
        elapsed = until - self.now
        changed = False
        for t in list(self._flowing):
            if ends[t] <= until:
                self._flowing.remove(t)
                t.remaining = 0.0
                t.flow_end = until
                t.done_at = until + self.latency
                heapq.heappush(self._landing, (t.done_at, t.order, t))
                changed = True
            else:
                t.remaining = max(t.remaining - t.rate * elapsed, 0.0)
        self.now = until
        started: list[Transfer] = []
        while self._starting and self._starting[0][0] <= until:
            started.append(heapq.heappop(self._starting)[2])
        if started:
            self._flowing.extend(started)
            changed = True
        if changed:
            self._share()
        for t in started:
            if t.overlap is not None:
                t.sent_before = min(t.bytes, overlapped_bytes(t.bytes, t.overlap, t.rate))
                t.remaining = t.bytes - t.sent_before
        if started and any(t.remaining <= 0 for t in started):
            # Nothing to send (an empty transfer): its bytes end at once.
            return self.advance(until)
        done: list[Transfer] = []
        while self._landing and self._landing[0][0] <= until:
            done.append(heapq.heappop(self._landing)[2])
        return done

    def _share(self) -> None:
        """Each flowing transfer's rate: the smaller of its ports' equal shares."""
        users: dict[int, int] = {}
        for t in self._flowing:
            users[t.src] = users.get(t.src, 0) + 1
            users[t.dst] = users.get(t.dst, 0) + 1
        for t in self._flowing:
            t.rate = self.bandwidth / max(users[t.src], users[t.dst])


@dataclass(frozen=True)
class TransferRecord:
    """One transfer, for metrics.json and requests.csv: `bytes` counts every shard."""

    id: str
    src: int
    dst: int
    bytes: int
    handed_at: float  # when its prefill replica handed it off (its first token home)
    start: float  # when its bytes could start (reservation held)
    done_at: float

    @property
    def seconds(self) -> float:
        return self.done_at - self.start

    @property
    def wait_s(self) -> float:
        """How long it waited at its prefill replica for a decode replica's blocks."""
        return self.start - self.handed_at
