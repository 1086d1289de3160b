"""One step's numbers as the engine reports them (`StepStats`, a row of `steps.csv`) and the
phases a step's time is split into: a type of the policy contract (the `last_step` of a view,
an observer's `on_step_end`), so it lives below both the contract and the engine.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

PHASES = (
    "schedule", "allocate", "build", "forward", "sample", "output", "apply", "hooks", "host",
    "readback", "wait", "software", "swap",
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
# host's seconds (the forward runs on its cores) and a real run's `host` is 0. `swap` is the
# KV blocks copied between the device and the host tier before the forward: a real run's
# measured copies, a simulation's predicted ones (its hardware's host link).
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
    # KV blocks copied to the host tier (preemption by swap) and back (readmissions), before
    # this step's forward (`engine.host_kv_memory_mb`; their seconds are the `swap` phase)
    swapped_out: int = 0
    swapped_in: int = 0
    # Sharing: the block references the tables hold (forked samples and prefix-cache hits
    # share blocks: above `blocks_in_use` by the blocks saved), and the blocks copied on the
    # device before this step's forward (a fork's copy on write)
    block_references: int = 0
    copied_blocks: int = 0
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
