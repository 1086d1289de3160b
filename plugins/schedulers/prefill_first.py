"""vLLM's first scheduler (v0, the PagedAttention paper's engine): prefills first, in
iterations of their own. Whenever a waiting request can be admitted, the step runs the new
prompts alone and every decode row waits; decode steps run only when no admission fits. This
keeps the batch's prefills whole and throughput high at the cost of generation stalls: the
decode rows' time between tokens grows by a whole prefill each time one is admitted, which is
what Sarathi-Serve's chunked prefills remove. `continuous` (Orca's rule) instead mixes whole
prefills into decode iterations."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Sequence, admit_fcfs, hookimpl
from plugins.schedulers.continuous import ContinuousScheduler


@dataclass
class PrefillFirstConfig(PolicyConfig):
    pass


class PrefillFirstScheduler(ContinuousScheduler):
    """Admit FCFS while the budgets allow; a step that admits runs its prefills alone."""

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_fcfs(view)

    def pause(self, view: EngineView, admitted: list[Sequence]) -> list[Sequence]:
        if not admitted:
            return []
        new = set(map(id, admitted))
        return [s for s in view.running if id(s) not in new]


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("prefill_first", PrefillFirstScheduler, PrefillFirstConfig)
