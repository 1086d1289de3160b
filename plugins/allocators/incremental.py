"""Incremental paged allocation (vLLM's PagedAttention): blocks for the tokens present at
admission, then one block at a time as a sequence crosses a block boundary. Packs more
requests into the pool; pays with preemption when the pool runs dry mid-flight."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import Allocator, PolicyConfig, Sequence, hookimpl


@dataclass
class IncrementalConfig(PolicyConfig):
    pass


class IncrementalAllocator(Allocator):
    """Paged blocks as tokens arrive (vLLM's PagedAttention); preempts when the pool runs dry."""

    def blocks_to_admit(self, seq: Sequence, block_size: int) -> int:
        return -(-seq.num_tokens // block_size)

    def blocks_to_grow(self, seq: Sequence, block_size: int, lookahead: int) -> int:
        # The next forward writes K/V up to position num_tokens + lookahead - 1.
        need = -(-(seq.num_tokens + lookahead) // block_size)
        return max(0, need - len(seq.block_table))


@hookimpl
def register_allocators(register) -> None:  # type: ignore[no-untyped-def]
    register("incremental", IncrementalAllocator, IncrementalConfig)
