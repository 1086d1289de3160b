"""The KV pool's use over time, in slots x seconds (`Counters.kv_*_slot_s`): after each step,
its state weighted by the step's duration. What the vLLM paper's Fig. 2 measures: token
states, slots reserved for tokens not yet generated, internal fragmentation (reserved past
the longest a request can get), external fragmentation (free but outside the largest extent
that could be placed), and, the rest, free. O(1) a step: the token states come from the
forward's rows, the overhang is kept as blocks are given and freed (`Planner.overhang`).

Sharing (a request's samples forked over one prompt, a prefix cache's hits) is counted as
the vLLM paper's Fig. 15 counts it: the blocks the tables hold (logical) over the blocks
in use (physical), time-averaged while any block is in use; the memory saving is then
1 - 1 / that average (`framework.run.summary`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.engine.block_pool import BlockPool
from framework.engine.counters import Counters

if TYPE_CHECKING:
    from framework.core.sequence import Sequence


def overhang(seq: Sequence, block_size: int) -> int:
    """Slots of `seq`'s blocks past the longest it can get (prompt + max_tokens): reserved
    and never used, the internal fragmentation of its reservation."""
    over = len(seq.block_table) * block_size - seq.max_len
    return over if over > 0 else 0


def account_kv(c: Counters, pool: BlockPool, states: int, dt: float) -> None:
    """Add the pool's state, `states` token states held, over the last `dt` seconds."""
    if dt <= 0:
        return
    bs = pool.block_size
    held = pool.num_used * bs
    c.kv_pool_slot_s += pool.num_blocks * bs * dt
    c.kv_state_slot_s += states * dt
    c.kv_internal_slot_s += c.kv_overhang_slots * dt
    c.kv_reserved_slot_s += max(0, held - states - c.kv_overhang_slots) * dt
    c.kv_external_slot_s += pool.external_free() * bs * dt
    if pool.num_used:
        c.kv_sharing_ratio_s += pool.references() / pool.num_used * dt
        c.kv_in_use_s += dt
