"""Iteration-level (continuous) batching, as in Orca: every step, finished rows leave before
the forward and waiting requests join while the budgets allow; prefill and decode rows share
a step."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Scheduler, Sequence, admit_fcfs, hookimpl


@dataclass
class ContinuousConfig(PolicyConfig):
    pass


class ContinuousScheduler(Scheduler):
    """Iteration-level batching (Orca): admit and evict at every step."""

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_fcfs(view)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("continuous", ContinuousScheduler, ContinuousConfig)
