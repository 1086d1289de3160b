"""The host KV tier: a second pool of blocks in host memory, where a request preempted by
swap keeps its KV until it is readmitted (`engine.host_kv_memory_mb`; vLLM's swap space).

A swap moves whole blocks between the tiers, and the copies are the executor's: each step's
plan carries the pairs (`Swaps`), which the executor copies before the forward, every copy
out before every copy in. The planner decides them in that order too: victims are swapped
out while the running rows grow (before any admission), and readmissions are swapped in as
they are admitted. So a device block freed by a swap-out and given out in the same step is
read before it is written (a readmission's copy in, or a row's forward), and a host block is
given to a swap-out only in a step after the one whose copy in read it.

The books are the pool's own: each host block has one owner (a double allocation or a free
by a non-owner raises at once), a request holds blocks in one tier at a time, and every
block comes home by the end of the run (`check`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from framework.api.policy import PreemptionCosts
from framework.core.sequence import Sequence
from framework.engine.batch import NO_SWAPS, Swaps
from framework.engine.block_pool import BlockPool, BlockPoolError
from framework.engine.counters import Counters


@runtime_checkable
class SwapCosts(Protocol):
    """What an executor predicts for a preemption policy choosing swap or recompute."""

    def swap_seconds(self, blocks: int) -> float:
        """Seconds to copy `blocks` KV blocks one way between the device and the host."""
        ...

    def prefill_seconds(self, tokens: int) -> float:
        """Seconds to prefill `tokens` tokens again, as one row."""
        ...


class HostTier:
    """The host pool, the swaps of the step being planned, and the costs a preemption
    policy weighs (`PreemptionCosts`), as the executor predicts them (`SwapCosts`)."""

    def __init__(
        self,
        pool: BlockPool,
        counters: Counters,
        block_bytes: int,
        predicts: SwapCosts,
    ) -> None:
        self.pool = pool
        self.counters = counters
        self.block_bytes = block_bytes
        self.predicts = predicts
        self._out: list[tuple[int, int]] = []
        self._into: list[tuple[int, int]] = []
        self._swapped: list[Sequence] = []  # swapped out in the step being planned

    def blocks(self, seq: Sequence) -> int:
        """Host blocks a swap of `seq` takes: those holding its computed tokens."""
        return self.pool.blocks_for(seq.num_computed)

    def costs(self, seq: Sequence) -> PreemptionCosts:
        n = self.blocks(seq)
        return PreemptionCosts(
            swap_s=2 * self.predicts.swap_seconds(n),  # out now, in when readmitted
            recompute_s=self.predicts.prefill_seconds(seq.num_computed),
            swap_blocks=n,
            host_free_blocks=self.pool.num_free,
        )

    def swap_out(self, seq: Sequence) -> bool:
        """Copy `seq`'s computed KV to host blocks (its device blocks are the caller's to
        free). False, with nothing done, when the host tier lacks the blocks."""
        n = self.blocks(seq)
        if n > self.pool.num_free:
            self.counters.swap_fallbacks += 1
            return False
        if seq.host_table:
            raise BlockPoolError(f"{seq.id} swapped out while its KV is already on the host")
        seq.host_table = self.pool.allocate(seq.id, n)
        self._swapped.append(seq)
        self._out.extend(zip(seq.block_table[:n], seq.host_table, strict=True))
        self.counters.swapped_out_blocks += n
        self.counters.swapped_out_bytes += n * self.block_bytes
        return True

    def swap_in(self, seq: Sequence) -> None:
        """Copy a readmitted `seq`'s KV back into the first of its new device blocks; its
        host blocks are free from now (read by this step's copy, before any reuse)."""
        host, n = seq.host_table, len(seq.host_table)
        if len(seq.block_table) < n:
            raise BlockPoolError(f"{seq.id} readmitted with {len(seq.block_table)} < {n} blocks")
        self._into.extend(zip(host, seq.block_table[:n], strict=True))
        self._release(seq)
        self.counters.swapped_in_blocks += n
        self.counters.swapped_in_bytes += n * self.block_bytes

    def drop(self, seq: Sequence) -> None:
        """`seq` leaves without coming back (an abort, its replica lost): its host blocks
        are freed uncopied."""
        if seq.host_table:
            self._release(seq)

    def _release(self, seq: Sequence) -> int:
        """The one way host blocks go back to the host pool; returns how many."""
        n = len(seq.host_table)
        self.pool.free(seq.id, seq.host_table)
        seq.host_table = []
        return n

    def take(self, runs: bool) -> Swaps:
        """The planned step's swaps; the next step's start empty. `runs`: whether the step
        runs a forward. One that runs nothing calls no executor, so nothing is copied: its
        victims recompute instead (counted as fallbacks), and it readmitted no one."""
        swapped, self._swapped = self._swapped, []
        if not runs:
            for seq in swapped:
                n = self._release(seq)
                c = self.counters
                c.swapped_out_blocks -= n
                c.swapped_out_bytes -= n * self.block_bytes
                c.swap_fallbacks += 1
                c.recomputed_tokens += seq.num_computed
                seq.num_computed = 0
            if self._into:
                raise BlockPoolError("a step that runs nothing readmitted a swapped request")
            self._out = []
            return NO_SWAPS
        if not (self._out or self._into):
            return NO_SWAPS
        swaps = Swaps(tuple(self._out), tuple(self._into))
        self._out, self._into = [], []
        return swaps

    def check(self, seqs: list[Sequence], end: bool = False) -> None:
        """The host pool's books agree, and its used blocks are exactly the swapped-out
        requests' tables, none of which also holds device blocks; at the `end`, none."""
        self.pool.check()
        if end and self.pool.num_used:
            leaked = self.pool.owners()
            raise BlockPoolError(f"{self.pool.num_used} host KV blocks leaked: {leaked}")
        held = 0
        for s in seqs:
            if s.host_table:
                if s.block_table:
                    raise BlockPoolError(f"{s.id} holds blocks in both tiers")
                held += len(s.host_table)
        if held != self.pool.num_used:
            raise BlockPoolError(
                f"swapped-out requests hold {held} host blocks, the host pool has "
                f"{self.pool.num_used} in use"
            )
