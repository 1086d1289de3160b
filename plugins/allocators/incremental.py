"""Incremental paged allocation (vLLM's PagedAttention): blocks for the tokens present at
admission, then one block at a time as a sequence crosses a block boundary. Packs more
requests into the pool; pays with preemption when the pool runs dry mid-flight."""

from __future__ import annotations

import math
from dataclasses import dataclass

from framework.api import Allocator, EngineView, PolicyConfig, Sequence, hookimpl


@dataclass
class IncrementalConfig(PolicyConfig):
    # The share of the pool admission keeps free for the running rows' growth (vLLM's
    # watermark, 0.01 there): a request is admitted only if that many blocks stay free.
    watermark: float = 0.0


class IncrementalAllocator(Allocator):
    """Paged blocks as tokens arrive (vLLM's PagedAttention); preempts when the pool runs dry."""

    def __init__(self, cfg: IncrementalConfig) -> None:
        super().__init__(cfg)
        if not 0.0 <= cfg.watermark < 1.0:
            raise ValueError(f"allocator.watermark must be in [0, 1), got {cfg.watermark}")
        self.watermark = cfg.watermark

    def admits(self, view: EngineView, seq: Sequence, free_blocks: int) -> bool:
        keep = math.ceil(self.watermark * view.num_blocks)
        return free_blocks - view.blocks_to_admit(seq) >= keep

    def blocks_to_admit(self, seq: Sequence, block_size: int) -> int:
        return -(-seq.num_tokens // block_size)

    def blocks_to_grow(self, seq: Sequence, block_size: int, lookahead: int) -> int:
        # The next forward writes K/V up to position num_tokens + lookahead - 1.
        more = -(-(seq.num_tokens + lookahead) // block_size) - len(seq.block_table)
        return more if more > 0 else 0  # not max(): called for every row of every step


@hookimpl
def register_allocators(register) -> None:  # type: ignore[no-untyped-def]
    register("incremental", IncrementalAllocator, IncrementalConfig)
