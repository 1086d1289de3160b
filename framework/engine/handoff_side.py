"""A replica's side of prefill/decode disaggregation: the seams a cluster moves a request
through (`framework.engine.handoff`). On its prefill replica, the request is handed off
after its first token (`take_handed_off`) and its blocks freed once its KV has gone
(`release_sent`); on its decode replica, blocks are reserved for the KV before it is sent
(`reserve`) and the request joins the running rows once the KV has landed (`accept`).
Each is a method of `Engine`; the books they keep live with the planner, which moves rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.engine.invariants import InvariantError
from framework.engine.sequence import Sequence, Status

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable

    from framework.api.policy import PolicyError
    from framework.engine.block_pool import BlockPool
    from framework.engine.planner import HandOff, Planner


class HandOffSide:
    """Mixed into `Engine`, whose attributes these are."""

    pool: BlockPool
    p: Any
    planner: Planner
    seqs: list[Sequence]
    sending: dict[str, Sequence]
    receiving: dict[str, Sequence]
    landed: deque[tuple[float, Sequence]]
    _fail: Callable[[str, str], PolicyError]  # the policy named in a PolicyError

    def take_handed_off(self) -> list[HandOff]:
        """The requests handed off since the last call (a prefill replica's, each after its
        first token), their blocks still held here until `release_sent`."""
        out = self.planner.outbox
        self.planner.outbox = []
        return out

    def reserve(self, seq: Sequence) -> Sequence | None:
        """Blocks for `seq`'s KV, coming from a prefill replica, before any of it is sent:
        priced as an admission (the allocator's `blocks_to_admit` and `admits`, as the
        planner asks them) of the request as it arrives, prompt and first token. Returns
        the request as this replica will serve it, its blocks reserved (held from now on),
        or None when the allocator declines or the pool lacks the blocks."""
        copy = seq.moved()
        bs = self.pool.block_size
        allocator = self.p.allocator
        n = allocator.blocks_to_admit(copy, bs)
        if not isinstance(n, int) or n * bs < copy.num_tokens:
            raise self._fail(
                "allocator", f"priced {copy.id}'s {copy.num_tokens} arriving tokens at {n!r} blocks"
            )
        free = self.pool.num_free
        if n > free or not allocator.admits(self.planner.view(), copy, free):
            return None
        copy.block_table = self.pool.allocate(copy.id, n)
        self.receiving[copy.id] = copy
        self.seqs.append(copy)
        return copy

    def accept(self, copy: Sequence, at: float) -> None:
        """`copy`'s KV has landed in its reserved blocks at `at`: it joins the running rows
        at this replica's first step from then with a free row (`Planner.join_landed`)."""
        if self.receiving.get(copy.id) is not copy:
            raise InvariantError(f"{copy.id}'s KV landed on a replica that did not reserve it")
        self.landed.append((at, copy))

    def release_sent(self, seq: Sequence, at: float) -> None:
        """`seq`'s KV has reached its decode replica: its blocks here are freed."""
        if self.sending.pop(seq.id, None) is not seq:
            raise InvariantError(f"{seq.id}'s KV was sent from a replica that does not hold it")
        self.planner.release(seq, Status.TRANSFERRED, at)
