"""First-come-first-served admission under the engine's budgets, shared by the built-in
schedulers (a third party may import it too)."""

from __future__ import annotations

from framework.policy import EngineView
from framework.sequence import Sequence


def admit_fcfs(view: EngineView, limit: int | None = None) -> list[Sequence]:
    """Admit from the head of the queue while rows, tokens and blocks allow.

    Stops at the first request that does not fit rather than skipping ahead: skipping would
    starve long prompts behind a stream of short ones.
    """
    rows = sum(1 for _ in view.running)
    tokens = view.step_tokens()
    free = view.free_blocks
    slots = view.max_num_seqs - rows if limit is None else min(limit, view.max_num_seqs - rows)
    admitted: list[Sequence] = []
    for seq in view.waiting:
        if len(admitted) >= slots:
            break
        need_tokens = seq.num_tokens - seq.num_computed
        need_blocks = view.blocks_to_admit(seq)
        if tokens + need_tokens > view.max_num_batched_tokens or need_blocks > free:
            break
        admitted.append(seq)
        tokens += need_tokens
        free -= need_blocks
    return admitted
