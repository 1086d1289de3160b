"""vLLM's first scheduler (v0, the PagedAttention paper's engine): prefills first, in
iterations of their own. Whenever a waiting request can be admitted, the step runs the new
prompts alone and every decode row waits; decode steps run only when no admission fits. This
keeps the batch's prefills whole and throughput high at the cost of generation stalls: the
decode rows' time between tokens grows by a whole prefill each time one is admitted, which is
what Sarathi-Serve's chunked prefills remove. `continuous` (Orca's rule) instead mixes whole
prefills into decode iterations.

`scheduler.decode_steps=k` is vLLM 0.6's multi-step scheduling (`--num-scheduler-steps k`):
once the batch decodes, it runs k decode steps before the scheduler looks at the queue again,
so a request that arrives, or a slot that frees, in the middle of a run waits for its end.
It changes the schedule (the counts), where the engine software profile `vllm-0.6-multistep`
prices the host time that scheduling once every k steps saves."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Sequence, admit_fcfs, hookimpl
from plugins.schedulers.continuous import ContinuousScheduler


@dataclass
class PrefillFirstConfig(PolicyConfig):
    decode_steps: int = 1  # decode steps run between two looks at the queue (1: every step)


class PrefillFirstScheduler(ContinuousScheduler):
    """Admit FCFS while the budgets allow; a step that admits runs its prefills alone."""

    def __init__(self, cfg: PrefillFirstConfig) -> None:
        super().__init__(cfg)
        if cfg.decode_steps < 1:
            raise ValueError(f"scheduler.decode_steps must be >= 1; got {cfg.decode_steps}")
        self.decode_steps = cfg.decode_steps
        self.run = 0  # decode steps of the current run so far (0: the queue is looked at)

    def admit(self, view: EngineView) -> list[Sequence]:
        if view.running and 0 < self.run < self.decode_steps:
            self.run += 1  # inside a run of decode steps: the queue waits for its end
            return []
        admitted = admit_fcfs(view)
        self.run = 0 if admitted or not view.running else 1
        return admitted

    def pause(self, view: EngineView, admitted: list[Sequence]) -> list[Sequence]:
        if not admitted:
            return []
        new = set(map(id, admitted))
        return [s for s in view.running if id(s) not in new]


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("prefill_first", PrefillFirstScheduler, PrefillFirstConfig)
