"""The KV pool's use over time, in slots x seconds (`Counters.kv_*_slot_s`): after each step,
its state weighted by the step's duration. What the vLLM paper's Fig. 2 measures: token
states, slots reserved for tokens not yet generated, internal fragmentation (reserved past
the longest a request can get), external fragmentation (free but outside the largest extent
that could be placed), and, the rest, free. O(1) a step: the token states come from the
forward's rows, the overhang is kept as blocks are given and freed (`Planner.overhang`)."""

from __future__ import annotations

from framework.engine.block_pool import BlockPool
from framework.engine.counters import Counters


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
