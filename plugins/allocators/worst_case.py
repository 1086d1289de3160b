"""Worst-case reservation: at admission, book every block the request could ever need
(prompt + max_tokens). Never preempts; holds memory that short answers never use."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import Allocator, PolicyConfig, Sequence, hookimpl


@dataclass
class WorstCaseConfig(PolicyConfig):
    pass


class WorstCaseAllocator(Allocator):
    """Reserves prompt + max_tokens worth of blocks at admission; never preempts."""

    def blocks_to_admit(self, seq: Sequence, block_size: int) -> int:
        return -(-seq.max_len // block_size)

    def blocks_to_grow(self, seq: Sequence, block_size: int, lookahead: int) -> int:
        need = -(-(seq.num_tokens + lookahead) // block_size)
        return max(0, need - len(seq.block_table))


@hookimpl
def register_allocators(register) -> None:  # type: ignore[no-untyped-def]
    register("worst_case", WorstCaseAllocator, WorstCaseConfig)
