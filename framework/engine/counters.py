"""The engine's books: the run's running `Counters` (each step's own are a `StepStats`,
`framework.core.step_stats`).

They hold only what the engine itself counted; turning them into the flat summary of a run
(`metrics.json`) is the run's job (`framework.run.summary`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    """Whole-run counts, accumulated by the engine as it goes."""

    token_slots: int = 0  # row-steps that sampled a token, kept or not
    tokens_kept: int = 0
    prefill_tokens: int = 0
    # Prefill rows computed: a prefill served whole is one chunk, a chunked one its chunks.
    prefill_chunks: int = 0
    preemptions: int = 0
    recomputed_tokens: int = (
        0  # tokens whose K/V was computed, dropped by preemption, computed again
    )
    # Preemption by swap (`engine.host_kv_memory_mb`): blocks and bytes copied to the host
    # tier and back; victims the policy would swap that the host tier could not hold
    # (recomputed instead).
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    swapped_out_bytes: int = 0
    swapped_in_bytes: int = 0
    swap_fallbacks: int = 0
    transfers: int = 0  # device-to-host readbacks of sampled tokens
    # Output accounting: deferred = tokens_kept + overshoot + held + lost, always. No held
    # token is ever lost to a preemption: held tokens come home before any row is preempted
    # (`Planner.grow`, `Planner.displace`; `Planner.preempt` refuses a row with one).
    deferred_tokens: int = 0  # sampled for a live request and held on the device
    held_tokens: int = 0  # of those, still on the device
    overshoot_tokens: int = 0  # arrived after their request's stop token: waste of the window
    expected_overshoot: float = 0.0
    # Prefix caching (allocator=prefix_cache): prompt tokens looked up at first admission,
    # and of those found cached; at a re-admission after a preemption, the cached tokens
    # found apart (they are recomputation saved, not prefix sharing); blocks evicted.
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_recompute_hit_tokens: int = 0
    prefix_evictions: int = 0  # the model: (k + 1) / 2 rows per stop-finished request
    # Requests ended from outside the engine (`Engine.abort`): their client went away
    # (`aborted`), or the server found one of their stop strings in their text.
    aborted: int = 0
    stop_strings: int = 0
    # KV memory over time (the vLLM paper's Fig. 2), in pool slots x seconds, each step's
    # state weighted by its duration: the whole pool; the slots holding token states; those
    # reserved for tokens not yet generated; internal fragmentation (reserved past the
    # longest the request can get, prompt + max_tokens: never used); external fragmentation
    # (free, but outside the largest extent that could be placed: `engine.kv_layout`). The
    # rest is free. `kv_overhang_slots` is the live count behind the internal share.
    kv_pool_slot_s: float = 0.0
    kv_state_slot_s: float = 0.0
    kv_reserved_slot_s: float = 0.0
    kv_internal_slot_s: float = 0.0
    kv_external_slot_s: float = 0.0
    kv_overhang_slots: int = 0
    # Sharing (`framework.engine.kv_usage`): the time-weighted sum of block references over
    # blocks in use, and the seconds any block was in use. Parallel samples' forks
    # (`framework.core.sample_group`): samples admitted over another's blocks, the blocks
    # they took shared, and the blocks copied for them to write (copy on write).
    kv_sharing_ratio_s: float = 0.0
    kv_in_use_s: float = 0.0
    forks: int = 0
    forked_blocks: int = 0
    cow_blocks: int = 0
    # Beam search (`framework.engine.beams`): rounds chosen, beams that took another's
    # blocks, and tokens kept and then dropped (hypotheses not returned, or shorter).
    beam_rounds: int = 0
    beam_retables: int = 0
    pruned_tokens: int = 0
    # A replica lost (`cluster.faults`): tokens sampled on its device and never read back,
    # gone with it (deferred = kept + overshoot + held + lost); and the positions it had
    # computed for the requests it held that a live replica computes again.
    lost_tokens: int = 0
    failure_recomputed_tokens: int = 0
