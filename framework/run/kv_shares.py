"""The KV pool's time-averaged shares (the vLLM paper's Fig. 2), from the engine's counters:
what share of the pool's slots, over the run, held token states, were reserved for tokens not
yet generated, were reserved past a request's length (internal fragmentation), lay free
outside the largest extent that could be placed (external fragmentation), or were free.

The five add up to 1. Under paged KV the reserved share is the last block's slack and the
external one is 0; under contiguous extents (`engine.kv_layout=contiguous`) both are real.
A request's length is prompt + max_tokens, as its reservation knows it: one that stops
earlier leaves what it never used counted as reserved. With a prefix cache a shared block
is one slot in the pool and a token state in each table that holds it."""

from __future__ import annotations

from framework.engine.counters import Counters

KV_SHARES = ("states", "reserved", "internal", "external", "free")


def kv_shares(c: Counters) -> dict[str, float]:
    """`kv_share_NAME` for each of `KV_SHARES` (0 for a run of no step)."""
    total = c.kv_pool_slot_s
    if total <= 0:
        return {f"kv_share_{k}": 0.0 for k in KV_SHARES}
    parts = {
        "states": c.kv_state_slot_s,
        "reserved": c.kv_reserved_slot_s,
        "internal": c.kv_internal_slot_s,
        "external": c.kv_external_slot_s,
    }
    parts = {k: min(v, total) / total for k, v in parts.items()}
    parts["free"] = max(0.0, 1.0 - sum(parts.values()))
    return {f"kv_share_{k}": v for k, v in parts.items()}
