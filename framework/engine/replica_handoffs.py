"""A replica's books of prefill/decode disaggregation: the requests that hold blocks here
outside the running rows while a cluster moves their KV (`framework.cluster.handoffs`).

On its prefill replica a request is handed off after its first token (`send`), its blocks
held until its KV has gone (`sent`, then the planner releases them); on its decode replica
blocks are reserved for the KV before it is sent (`reserve`), and the request joins the
running rows once the KV has landed (`accept`, then `land` when a row is free). The planner,
which owns the queues, makes both moves of the running rows; these books hold the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.core.sequence import Sequence
from framework.engine.invariants import InvariantError

if TYPE_CHECKING:
    from framework.api.policy import EngineView, PolicyError
    from framework.engine.block_pool import BlockPool


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

    def __init__(self) -> None:
        self.sending: dict[str, Sequence] = {}
        self.outbox: list[HandOff] = []  # hand-offs the cluster has not taken yet
        self.receiving: dict[str, Sequence] = {}
        self.landed: deque[tuple[float, Sequence]] = deque()

    def __bool__(self) -> bool:
        """Whether any request holds blocks here outside the running rows."""
        return bool(self.sending or self.receiving)

    def parked(self) -> list[Sequence]:
        """The requests these books hold blocks for (the invariant check's `parked`)."""
        return [*self.sending.values(), *self.receiving.values()]

    # ---- the prefill side -------------------------------------------------------------
    def send(self, seq: Sequence, at: float, forward_s: float) -> None:
        """`seq` has left the running rows at `at`, its part here done, its blocks held."""
        self.sending[seq.id] = seq
        self.outbox.append(HandOff(seq, at, forward_s))

    def take(self) -> list[HandOff]:
        """The requests handed off since the last call, for the cluster to move."""
        out, self.outbox = self.outbox, []
        return out

    def sent(self, seq: Sequence) -> Sequence:
        """`seq`'s KV has reached its decode replica: it leaves these books (its blocks are
        the planner's to release)."""
        if self.sending.pop(seq.id, None) is not seq:
            raise InvariantError(f"{seq.id}'s KV was sent from a replica that does not hold it")
        return seq

    # ---- the decode side --------------------------------------------------------------
    def reserve(
        self,
        seq: Sequence,
        pool: BlockPool,
        allocator: Any,
        view: Callable[[], EngineView],
        fail: Callable[[str, str], PolicyError],
    ) -> Sequence | None:
        """Blocks for `seq`'s KV, coming from a prefill replica, before any of it is sent:
        priced as an admission (the allocator's `blocks_to_admit` and `admits`, as the
        planner asks them) of the request as it arrives, prompt and first token. Returns
        the request as this replica will serve it, its blocks reserved (held from now on),
        or None when the allocator declines or the pool lacks the blocks."""
        copy = seq.copy_for(kv_sent=True)
        bs = pool.block_size
        n = allocator.blocks_to_admit(copy, bs)
        if not isinstance(n, int) or n * bs < copy.num_tokens:
            raise fail(
                "allocator", f"priced {copy.id}'s {copy.num_tokens} arriving tokens at {n!r} blocks"
            )
        free = pool.num_free
        if not pool.can_place([n]) or not allocator.admits(view(), copy, free):
            return None
        copy.block_table = pool.allocate(copy.id, n)
        self.receiving[copy.id] = copy
        return copy

    def accept(self, copy: Sequence, at: float) -> None:
        """`copy`'s KV has landed in its reserved blocks at `at`: it joins the running rows
        at this replica's first step from then with a free row (`Planner.join_landed`)."""
        if self.receiving.get(copy.id) is not copy:
            raise InvariantError(f"{copy.id}'s KV landed on a replica that did not reserve it")
        self.landed.append((at, copy))

    def land(self) -> Sequence:
        """The earliest landed request leaves these books to join the running rows."""
        _, seq = self.landed.popleft()
        del self.receiving[seq.id]
        return seq
