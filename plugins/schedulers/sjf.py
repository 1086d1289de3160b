"""Shortest job first: the waiting request with the fewest `max_tokens` is admitted first,
FCFS among equals. It cuts mean latency when lengths are known up front (a `max_tokens`
that is a real budget, not a ceiling), and pays with starvation: under a steady stream of
short requests a long one may wait indefinitely."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Scheduler, Sequence, admit_in_order, hookimpl


@dataclass
class SJFConfig(PolicyConfig):
    pass


def job_length(seq: Sequence) -> int:
    """The job's size as the user declared it: the most tokens it may generate."""
    return seq.sampling.max_tokens


class SJFScheduler(Scheduler):
    """Shortest job first: the fewest `max_tokens` is admitted first, FCFS among equals."""

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_in_order(view, job_length)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("sjf", SJFScheduler, SJFConfig)
