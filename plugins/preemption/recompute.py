"""Preemption by victim order: the victim's blocks go back to the pool and it rejoins the head
of the waiting queue. By recompute (the default), prompt plus generated tokens are prefilled
again when it is readmitted; by swap (`preemption.mode=swap`, with a host tier:
`engine.host_kv_memory_mb`), its KV is copied to host memory and back; `cheaper` picks per
victim by the engine's predicted cost of each."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import (
    EngineView,
    PolicyConfig,
    Preemption,
    Sequence,
    check_mode,
    choose_mode,
    hookimpl,
)

VICTIMS = ("newest", "oldest", "most_blocks")


@dataclass
class RecomputeConfig(PolicyConfig):
    # newest: the most recently admitted goes first (vLLM's choice: it has the least work
    # to redo, and the oldest request always progresses, so nothing livelocks).
    victim: str = "newest"
    # recompute | swap | cheaper: how the victim gives its blocks back (`choose_mode`)
    mode: str = "recompute"


class RecomputePreemption(Preemption):
    """Frees a victim's blocks and requeues it: prefilled again, or its KV swapped (mode)."""

    def __init__(self, cfg: RecomputeConfig) -> None:
        super().__init__(cfg)
        if cfg.victim not in VICTIMS:
            raise ValueError(
                f"preemption.victim must be one of {', '.join(VICTIMS)}; got {cfg.victim!r}"
            )
        self.victim = cfg.victim
        self.setting = check_mode(cfg.mode)

    def mode(self, view: EngineView, victim: Sequence) -> str:
        return choose_mode(self.setting, view, victim)

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
