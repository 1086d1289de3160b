"""The engine's answers to a policy view's questions (`ViewRules`): a prefix lookup, a chunk as
the scheduler gives it, the allocator's price and veto, a preemption's predicted costs.

A view holds this object and nothing else of the engine: none of its methods moves a block,
a request or a token. A prefix cache makes each lookup once per request while it stays as it
is, over the request's kept block hashes (`PrefixCachingPool.cached_blocks`), so a request
that a scheduler, the admission check and the price all ask about is walked once.

The one record a lookup leaves is the one the policy contract promises: a waiting request's
cached prefix (`Sequence.cached_prefix`), which its `step_tokens` then leaves out, so that the
scheduler's `chunk` charges it only what its forward computes. It holds for the step's
planning only: `forget` clears it before the next choice of admissions, as the blocks it
counted may be evicted since.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.core.sequence import Sequence, Status

if TYPE_CHECKING:
    from framework.api.policy import EngineView, PreemptionCosts
    from framework.engine.block_pool import BlockPool
    from framework.engine.host_tier import HostTier
    from framework.engine.settings import GuardedPolicies


class Lookups:
    def __init__(
        self, pool: BlockPool, policies: GuardedPolicies, tier: HostTier | None = None
    ) -> None:
        self.pool = pool
        self.p = policies
        self.tier = tier
        self.cuts_prefills = True  # whether the scheduler has a `chunk` of its own
        self._recorded: list[Sequence] = []  # waiting requests whose cached prefix is set

    def fork_source(self, seq: Sequence) -> Sequence | None:
        """The running sample of `seq`'s request whose blocks `seq` can fork from: one with
        the prompt computed up to its last token (`framework.core.sample_group`). None for a
        request of one sample, a pool that cannot share, a sample whose KV is on the host
        tier, a one-token prompt (nothing to share), or no such sample running now."""
        group = seq.group
        if group is None or seq.host_table or seq.prompt_len < 2 or not self.pool.forks:
            return None
        reads = seq.prompt_len - 1
        for other in group.members:
            if other is not seq and other.status is Status.RUNNING and other.num_computed >= reads:
                return other
        return None

    def cached_tokens(self, seq: Sequence) -> int:
        """`view.cached_tokens`: `seq`'s leading tokens in the prefix cache now, or, for a
        sample that can fork, its prompt but the last token. A waiting request's forward
        would skip them: recorded as its cached prefix until the next choice of
        admissions. A request that asks for its prompt's log-probabilities takes nothing
        from the prefix cache: each prompt position it computes is scored."""
        if seq.group is not None and self.fork_source(seq) is not None:
            n = seq.prompt_len - 1
        elif seq.sampling.prompt_logprobs is not None:  # every prompt position is scored
            n = 0
        else:
            n = len(self.pool.cached_blocks(seq)) * self.pool.block_size
        if seq.status is Status.WAITING and seq.cached_prefix != n:
            seq.cached_prefix = n
            self._recorded.append(seq)
        return n

    def taken(self, seq: Sequence, source: Sequence | None) -> list[int]:
        """The blocks an admission takes from other tables: from its fork's `source`, the
        full ones before the prompt's last token (never written again); else the prefix
        cache's blocks it was charged for."""
        bs = self.pool.block_size
        if source is not None:
            return source.block_table[: (seq.prompt_len - 1) // bs]
        held = self.pool.cached_blocks(seq)[: seq.cached_prefix // bs]
        if len(held) * bs != seq.cached_prefix:
            raise RuntimeError(
                f"engine: {seq.id} was charged for {seq.cached_prefix} cached tokens "
                f"and finds {len(held) * bs}"
            )
        return held

    def forget(self) -> None:
        """The lookups recorded on waiting requests end with the planning they were made in."""
        for seq in self._recorded:
            if seq.status is Status.WAITING:
                seq.cached_prefix = 0
        self._recorded.clear()
        self.pool.forget_trials()

    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        """`view.chunk`: under a prefix cache, what `seq` finds cached is left out first."""
        self.cached_tokens(seq)
        if not self.cuts_prefills:
            return seq.step_tokens
        chunk: int = self.p.scheduler.chunk(view, seq, budget)
        return chunk

    def admits(self, view: EngineView, seq: Sequence, free_blocks: int) -> bool:
        """`view.admits`: whether the pool can place `seq`'s blocks after this step's earlier
        admissions (under contiguous extents, free blocks must stand together), and the
        allocator's veto."""
        # Any free block serves a paged pool: the price was already held to `free_blocks`.
        if self.pool.layout != "paged" and not self.pool.would_place(self.price(seq), free_blocks):
            return False
        admitted: bool = self.p.allocator.admits(view, seq, free_blocks)
        return admitted

    def price(self, seq: Sequence) -> int:
        """`view.blocks_to_admit`: the free blocks admitting `seq` takes, the allocator's
        price less the cached blocks it shares that another table holds already (those
        cost nothing; an evictable cached block costs one, like a fresh one)."""
        n: int = self.p.allocator.blocks_to_admit(seq, self.pool.block_size)
        if seq.group is not None and self.fork_source(seq) is not None:
            return n - (seq.prompt_len - 1) // self.pool.block_size  # held by its source
        if seq.sampling.prompt_logprobs is not None:  # takes nothing cached (`cached_tokens`)
            return n
        return n - self.pool.in_use(self.pool.cached_blocks(seq))

    def preemption_costs(self, seq: Sequence) -> PreemptionCosts | None:
        """Swap against recompute for running `seq`, as the executor predicts them."""
        return self.tier.costs(seq) if self.tier is not None else None
