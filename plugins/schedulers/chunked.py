"""Chunked prefill with stall-free batching (Sarathi-Serve): continuous batching in which a
long prompt is computed a chunk per step beside the running decodes instead of in one step
that stalls them all.

Each step, in Sarathi's order: every running decode row its one token, then the rows part
way through a prefill their next chunk, then new requests FCFS, each prefill at most
`chunk_size` tokens and the step at most `engine.max_num_batched_tokens`. A prompt longer
than the budget is served in chunks instead of being rejected, and so is a preempted
request's recompute. A row whose chunk stops short of its prompt's end samples nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import (
    EngineView,
    PolicyConfig,
    Scheduler,
    Sequence,
    admit_fcfs,
    chunk_prefill,
    hookimpl,
)


@dataclass
class ChunkedConfig(PolicyConfig):
    # Tokens of one prefill per step; null: only the step's budget
    # (engine.max_num_batched_tokens) cuts a prefill.
    chunk_size: int | None = 512


class ChunkedScheduler(Scheduler):
    """Chunked prefill (Sarathi-Serve): decodes first, then unfinished chunks, then new prefills."""

    def __init__(self, cfg: ChunkedConfig) -> None:
        super().__init__(cfg)
        if cfg.chunk_size is not None and cfg.chunk_size < 1:
            raise ValueError(f"scheduler.chunk_size must be >= 1 or null, got {cfg.chunk_size}")
        self.chunk_size = cfg.chunk_size

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_fcfs(view)

    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        return chunk_prefill(seq, budget, self.chunk_size)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("chunked", ChunkedScheduler, ChunkedConfig)
