"""Admission under the engine's budgets in a policy's order, shared by the built-in
schedulers and open to any third party: `from framework.api import admit_in_order`.

A scheduler that differs only in who goes first (FCFS, priority, shortest job first) passes
an ordering key; the budget arithmetic stays in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from framework.api.policy import EngineView
from framework.core.sequence import Sequence

OrderKey = Callable[[Sequence], Any]


def chunk_prefill(seq: Sequence, budget: int, chunk_size: int | None) -> int:
    """A prefill chunk as Sarathi-Serve and vLLM cut it: what `seq` has pending, at most
    `chunk_size` tokens (None: no cap of its own) and at most the `budget` left in the step.
    0 when nothing is left: `admit_in_order` then admits no further. The one line a
    scheduler's `chunk` needs: `return chunk_prefill(seq, budget, self.cfg.chunk_size)`."""
    cap = budget if chunk_size is None else min(chunk_size, budget)
    return max(0, min(seq.step_tokens, cap))


def admit_fcfs(view: EngineView, limit: int | None = None) -> list[Sequence]:
    """Admit in waiting-queue order: arrival order, preempted requests at the head."""
    return admit_in_order(view, None, limit)


def room_for(
    view: EngineView, seq: Sequence, rows: int, tokens: int, free: int
) -> tuple[int, int] | None:
    """The tokens and blocks `seq` takes if it can join a step that already holds `rows` rows
    and `tokens` tokens with `free` blocks left, else None: its chunk (`view.chunk`, what a
    prefix cache already holds not charged), the step's row and token caps, its blocks, and
    the allocator's say (`view.admits`). The one budget test, for admitting and for a
    scheduler that asks what would make room."""
    need_tokens = view.chunk(seq, view.max_num_batched_tokens - tokens)
    need_blocks = view.blocks_to_admit(seq)
    if (
        rows >= view.max_num_seqs
        or need_tokens < 1
        or tokens + need_tokens > view.max_num_batched_tokens
        or need_blocks > free
        or not view.admits(seq, free)
    ):
        return None
    return need_tokens, need_blocks


def admit_in_order(
    view: EngineView, key: OrderKey | None = None, limit: int | None = None
) -> list[Sequence]:
    """Admit waiting requests in `key` order while rows, tokens and blocks allow (`room_for`).

    `key` ranks the waiting queue (smallest first); the sort is stable, so ties keep the
    queue's order (preempted requests first, then by arrival). None keeps the queue's order.
    `limit` caps how many are admitted this step.

    Stops at the first request that does not fit rather than skipping ahead: skipping would
    starve a large request behind a stream of smaller ones that each happen to fit.
    """
    # In queue order, walk the queue lazily: the loop stops at the first misfit, so FCFS
    # costs the same with ten or ten thousand waiting.
    queue = view.waiting if key is None else sorted(view.waiting, key=key)
    rows = len(view.running)
    tokens = view.step_tokens()
    free = view.free_blocks
    slots = view.max_num_seqs - rows if limit is None else min(limit, view.max_num_seqs - rows)
    admitted: list[Sequence] = []
    for seq in queue:
        if len(admitted) >= slots:
            break
        need = room_for(view, seq, rows + len(admitted), tokens, free)
        if need is None:
            break
        admitted.append(seq)
        tokens += need[0]
        free -= need[1]
    return admitted
