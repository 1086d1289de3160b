"""Static batching: a batch is admitted only when nothing runs, and runs until its slowest
member ends. Finished members keep their row in every forward (their tokens are discarded
and counted as waste), which is what padded static batching really pays."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Scheduler, Sequence, admit_fcfs, hookimpl


@dataclass
class StaticConfig(PolicyConfig):
    pass


class StaticScheduler(Scheduler):
    """Static batching: a batch runs until its slowest member ends; finished rows are waste."""

    def evict(self, view: EngineView) -> list[Sequence]:
        if view.running and all(s.finished for s in view.running):
            return list(view.running)
        return []

    def admit(self, view: EngineView) -> list[Sequence]:
        if view.running:
            return []
        return admit_fcfs(view)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("static", StaticScheduler, StaticConfig)
