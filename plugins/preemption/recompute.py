"""Preemption by recompute: the victim's blocks go back to the pool and it rejoins the head
of the waiting queue; when readmitted, prompt plus generated tokens are prefilled again."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Preemption, Sequence, hookimpl

VICTIMS = ("newest", "oldest", "most_blocks")


@dataclass
class RecomputeConfig(PolicyConfig):
    # newest: the most recently admitted goes first (vLLM's choice: it has the least work
    # to redo, and the oldest request always progresses, so nothing livelocks).
    victim: str = "newest"


class RecomputePreemption(Preemption):
    """Frees a victim's blocks and requeues it for a new prefill (victim: newest, oldest, ...)."""

    def __init__(self, cfg: RecomputeConfig) -> None:
        super().__init__(cfg)
        if cfg.victim not in VICTIMS:
            raise ValueError(
                f"preemption.victim must be one of {', '.join(VICTIMS)}; got {cfg.victim!r}"
            )
        self.victim = cfg.victim

    def victims(self, view: EngineView, blocks_short: int) -> list[Sequence]:
        candidates = [s for s in view.running if not s.finished]
        if not candidates:
            return []
        if self.victim == "newest":
            return [max(candidates, key=lambda s: s.admit_order)]
        if self.victim == "oldest":
            # Even the last unfinished row: in a static batch finished rows may hold the
            # blocks it needs, and it is readmitted once the batch ends.
            return [min(candidates, key=lambda s: s.admit_order)]
        return [max(candidates, key=lambda s: (len(s.block_table), s.admit_order))]


@hookimpl
def register_preemptions(register) -> None:  # type: ignore[no-untyped-def]
    register("recompute", RecomputePreemption, RecomputeConfig)
