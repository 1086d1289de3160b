"""Priority-aware preemption by recompute: when the pool runs dry, the least urgent running
request (highest `priority` value) gives up its blocks, newest among equals (it has the least
work to redo, as vLLM's default). The victim rejoins the waiting queue and is prefilled
again when readmitted.

The engine needs a victim whenever the pool is short, so the most urgent row is preempted
only when it is the last unfinished row; a request alone always fits the pool (the engine
rejects up front any request that could not), so it is readmitted once the finished rows
holding the rest have left.
"""

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


@dataclass
class PriorityPreemptionConfig(PolicyConfig):
    # recompute | swap | cheaper: how the victim gives its blocks back (`choose_mode`)
    mode: str = "recompute"


class PriorityPreemption(Preemption):
    """Frees the least urgent running request (newest among equals) when the pool is dry."""

    def __init__(self, cfg: PriorityPreemptionConfig) -> None:
        super().__init__(cfg)
        self.setting = check_mode(cfg.mode)

    def mode(self, view: EngineView, victim: Sequence) -> str:
        return choose_mode(self.setting, view, victim)

    def victims(self, view: EngineView, blocks_short: int) -> list[Sequence]:
        candidates = [s for s in view.running if not s.finished]
        if not candidates:
            return []
        return [max(candidates, key=lambda s: (s.priority, s.admit_order))]


@hookimpl
def register_preemptions(register) -> None:  # type: ignore[no-untyped-def]
    register("priority", PriorityPreemption, PriorityPreemptionConfig)
