"""The engine's books: one `StepStats` per step and the run's running `Counters`.

They hold only what the engine itself counted; turning them into the flat summary of a run
(`metrics.json`) is the run's job (`framework.run.summary`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

PHASES = (
    "schedule", "allocate", "build", "forward", "sample", "output", "apply", "hooks", "host",
    "readback", "wait", "software",
)  # fmt: skip
# The engine's own work, measured phase by phase; under a simulation's modelled host time
# (`executor.host_time=model`) they read 0 and the modelled cost is `host` instead.
# `software` is a simulated engine's own software (`executor.software`): its scheduling,
# launches and output processing that the device did not hide.
# `readback` is a simulation's predicted readbacks of sampled tokens (the profile's
# `readback_s` per transfer); a real run's readbacks are timed inside `output`. `wait` is a
# simulated GPU's (`executor.overlap`): the host standing idle while the device finishes
# earlier work. There `forward` and `sample` are the device's seconds, which run beside the
# host's phases, so a step's phases add up to more than its time; the host's own timeline
# is every phase but those two. A real run on CUDA is the same: its `forward` and `sample`
# are the device's seconds between events on its stream, read when the step's tokens are
# drained (`framework.engine.held`; until then, in the step's hooks, the launches), and the
# host's seconds launching them are in `host`. On a CPU `forward` and `sample` are the
# host's seconds (the forward runs on its cores) and a real run's `host` is 0.
HOST_PHASES = ("schedule", "allocate", "build", "output", "apply", "hooks")


@dataclass
class StepStats:
    step: int
    time: float  # seconds since run start, at the end of the step
    rows: int  # rows in the forward (finished rows of a static batch included)
    paused_rows: int  # running rows that sat the step out (a prefill-only step's decodes)
    prefill_rows: int
    prefill_tokens: int
    decode_rows: int
    decode_tokens: int  # one per decode row; prefill_tokens + decode_tokens = the step's tokens
    partial_rows: int  # prefill chunks short of their end: computed, nothing sampled
    wasted_rows: int  # rows whose sampled token nobody keeps
    tokens_kept: int  # tokens that reached an unfinished request this step
    admitted: int
    evicted: int
    preempted: int
    waiting: int
    blocks_in_use: int
    transfers: int
    held_steps: int  # steps of sampled tokens still on the device after this step
    window: float  # the output policy's window in force
    phase_s: dict[str, float] = field(default_factory=dict)

    def values(self) -> tuple[Any, ...]:
        """One row of steps.csv, in `STEP_COLUMNS` order: a tuple, not a dict, because a
        whole day's trace is a million steps (as dicts, 1 GB and most of a minute to write)."""
        get = self.phase_s.get
        return (*_step_fields(self), *[get(name, 0.0) for name in PHASES])


_FIELDS = tuple(f.name for f in fields(StepStats) if f.name != "phase_s")
_step_fields = operator.attrgetter(*_FIELDS)  # a tuple of the fields, in one C call
STEP_COLUMNS = (*_FIELDS, *(f"{name}_s" for name in PHASES))  # steps.csv's header


def step_value(stats: StepStats, column: str) -> Any:
    """One `STEP_COLUMNS` cell of a step: a field, or a phase's seconds (`NAME_s`)."""
    if column.endswith("_s") and column[:-2] in PHASES:
        return stats.phase_s.get(column[:-2], 0.0)
    return getattr(stats, column)


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
    # A replica lost (`cluster.faults`): tokens sampled on its device and never read back,
    # gone with it (deferred = kept + overshoot + held + lost); and the positions it had
    # computed for the requests it held that a live replica computes again.
    lost_tokens: int = 0
    failure_recomputed_tokens: int = 0
