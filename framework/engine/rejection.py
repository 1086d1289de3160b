"""Why a request can never be served by an engine, whatever the schedule: it is rejected up
front with the reason, not left waiting for room that will never come."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framework.api.policy import Allocator
    from framework.core.sequence import Sequence
    from framework.engine.block_pool import BlockPool
    from framework.engine.settings import Limits
    from framework.plugin_host.guard import Guarded


def why_never(
    seq: Sequence,
    pool: BlockPool,
    limits: Limits,
    allocator: Guarded[Allocator],
    cuts_prefills: bool,
) -> str | None:
    """A request that no schedule can ever serve is rejected up front, with the reason."""
    if seq.max_len > limits.max_model_len:
        return (
            f"prompt + max_tokens = {seq.max_len} exceeds the model's context "
            f"({limits.max_model_len})"
        )
    need = pool.blocks_for(seq.max_len)
    if need > pool.num_blocks:
        return (
            f"prompt + max_tokens = {seq.max_len} needs {need} blocks; the pool has "
            f"{pool.num_blocks} (engine.num_blocks)"
        )
    if pool.layout != "paged":  # one extent, as the allocator prices it
        need = max(need, allocator.blocks_to_admit(seq, pool.block_size))
        if need > pool.max_extent:
            return (
                f"its reservation of {need} blocks is more than the largest extent the "
                f"pool can ever place ({pool.max_extent} of {pool.num_blocks} "
                "blocks, engine.kv_layout=contiguous)"
            )
    if seq.max_len > limits.max_num_batched_tokens and not cuts_prefills:
        return (
            f"prompt + max_tokens = {seq.max_len} exceeds engine.max_num_batched_tokens "
            f"= {limits.max_num_batched_tokens} (a preempted request is prefilled "
            f"again whole)"
        )
    return None
