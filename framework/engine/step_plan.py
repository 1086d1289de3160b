"""One step's plan, the seam between planning and the forward: the rows to run and how much
of each, which is all the batch build reads (`Planner.plan` makes it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from framework.core.sequence import Sequence
from framework.engine.batch import NO_SWAPS, Swaps


@dataclass(frozen=True)
class StepPlan:
    """One step's plan: everything the batch build reads, and what planning did. Made once,
    when the planning is done, and never changed after (frozen).

    `rows` are the forward's rows in order. Each computes `tokens(seq)` tokens: all it has
    pending (`step_tokens`; a finished row of a static batch, one), or, for a row cut short
    (chunked prefill), the count in `partial`. `cache_hits` holds each admission's leading
    tokens found in the prefix cache, which its forward reads and does not compute.
    `swaps` are the block copies between the device and the host tier that the executor
    makes before the forward (preemptions by swap, readmissions of swapped requests);
    `copies` the copies within the device, after the copies out and before those in (the
    block each forked sample writes next: `framework.core.sample_group`)."""

    rows: list[Sequence] = field(default_factory=list)
    partial: dict[Sequence, int] = field(default_factory=dict)
    cache_hits: dict[Sequence, int] = field(default_factory=dict)
    evicted: int = 0
    preempted: int = 0
    admitted: int = 0
    paused: int = 0  # running rows that sit the step out (`Scheduler.pause`)
    swaps: Swaps = NO_SWAPS  # KV blocks copied between the tiers before the forward
    copies: tuple[tuple[int, int], ...] = ()  # (from, to) blocks on the device

    def tokens(self, seq: Sequence) -> int:
        """The tokens `seq`'s row computes in this step's forward."""
        n = self.partial.get(seq)
        return seq.step_tokens if n is None else n
