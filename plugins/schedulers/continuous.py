"""Iteration-level (continuous) batching, as in Orca: every step, finished rows leave before
the forward and waiting requests join while the budgets allow; prefill and decode rows share
a step."""

from __future__ import annotations

from dataclasses import dataclass

from framework.hookspecs import hookimpl
from framework.policy import EngineView, PolicyConfig, Scheduler
from framework.sequence import Sequence
from plugins.schedulers.admission import admit_fcfs


@dataclass
class ContinuousConfig(PolicyConfig):
    pass


class ContinuousScheduler(Scheduler):
    def evict(self, view: EngineView) -> list[Sequence]:
        return [s for s in view.running if s.finished]

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_fcfs(view)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("continuous", ContinuousScheduler, ContinuousConfig)
