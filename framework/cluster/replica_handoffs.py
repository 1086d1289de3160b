"""A replica's books of prefill/decode disaggregation: the requests that hold blocks on it
outside the running rows while the cluster moves their KV (`framework.cluster.handoffs`).

The books keep the replica's parked requests (`framework.engine.parking.Parking`, handed to
the engine by `Engine.attach_parking`). On a prefill replica a request is handed off after
its first token (`leave`), its blocks held until its KV has gone (`sent`, then the engine
releases them, `Status.MOVED`); on a decode replica blocks are reserved for the KV before it
is sent (`reserve`), and the request joins the running rows once the KV has landed
(`accept`, then `land` when a row is free). The engine, which owns the queues and the pool,
makes every move of the rows and blocks; these books hold the rest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.core.sequence import Sequence, Status
from framework.engine.invariants import InvariantError

if TYPE_CHECKING:
    from framework.engine.loop import Engine


@dataclass(frozen=True)
class HandOff:
    """A request whose part on this replica is done (a prefill replica's, at its first
    token): when it left the running rows, its blocks still held, and the forward seconds
    of the step that sampled its token (what a layer-wise transfer overlaps)."""

    seq: Sequence
    at: float
    forward_s: float


class ReplicaHandOffs:
    """Here a request's blocks are held either by a running row or by one of these:
    - `sending`: handed off after its part here (its first token), its KV not yet sent;
    - `receiving`: blocks reserved for a request's KV coming from a prefill replica, in
      flight or `landed` (arrived, at that time), until it joins the running rows."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sending: dict[str, Sequence] = {}
        self.outbox: list[HandOff] = []  # hand-offs the cluster has not taken yet
        self.receiving: dict[str, Sequence] = {}
        self.landed: deque[tuple[float, Sequence]] = deque()
        engine.attach_parking(self)

    # ---- what the engine reads (`Parking`) --------------------------------------------
    def __bool__(self) -> bool:
        return bool(self.sending or self.receiving)

    @property
    def leaving(self) -> list[Sequence]:
        return list(self.sending.values())

    @property
    def joining(self) -> list[Sequence]:
        return list(self.receiving.values())

    def leave(self, seq: Sequence, at: float, forward_s: float) -> None:
        self.sending[seq.id] = seq
        self.outbox.append(HandOff(seq, at, forward_s))

    def next_landing(self) -> float | None:
        return self.landed[0][0] if self.landed else None

    def land(self) -> Sequence:
        _, seq = self.landed.popleft()
        del self.receiving[seq.id]
        return seq

    # ---- the prefill side -------------------------------------------------------------
    def take(self) -> list[HandOff]:
        """The requests handed off since the last call, for the cluster to move, their
        blocks still held here until `sent`."""
        out, self.outbox = self.outbox, []
        return out

    def sent(self, seq: Sequence, at: float) -> None:
        """`seq`'s KV has reached its decode replica at `at`: it leaves these books and the
        engine releases its blocks (`Status.MOVED`: its decode replica serves the rest)."""
        if self.sending.pop(seq.id, None) is not seq:
            raise InvariantError(f"{seq.id}'s KV was sent from a replica that does not hold it")
        self.engine.planner.release(seq, Status.MOVED, at)

    # ---- the decode side --------------------------------------------------------------
    def reserve(self, seq: Sequence) -> Sequence | None:
        """Blocks for `seq`'s KV, coming from a prefill replica, before any of it is sent
        (`Engine.reserve_for`: priced as an admission of the request as it arrives, prompt
        and first token). Returns the request as this replica will serve it, its blocks
        reserved (held from now on), or None when they cannot be reserved now."""
        copy = seq.copy_for(kv_sent=True)
        if not self.engine.reserve_for(copy):
            return None
        self.receiving[copy.id] = copy
        return copy

    def accept(self, copy: Sequence, at: float) -> None:
        """`copy`'s KV has landed in its reserved blocks at `at`: it joins the running rows
        at this replica's first step from then with a free row (`Planner.join_landed`)."""
        if self.receiving.get(copy.id) is not copy:
            raise InvariantError(f"{copy.id}'s KV landed on a replica that did not reserve it")
        self.landed.append((at, copy))
