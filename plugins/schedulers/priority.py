"""Priority scheduling: the most urgent waiting request (lowest `priority`) is admitted
first; equal priorities keep the queue's order (preempted requests first, then by arrival).

Admission never skips ahead: when the most urgent request does not fit, nothing less urgent
is admitted in its place, so urgent work is not starved by a stream of small, less urgent
requests. Pair it with `preemption=priority`, so that a dry pool takes blocks from the least
urgent rows.

It also preempts for the urgent: the engine calls `displace` before admission (policy API
2, the step's `admit` phase), and the running rows it names are preempted, their blocks freed
and the rows requeued, so that the most urgent waiting request fits at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import (
    EngineView,
    PolicyConfig,
    Scheduler,
    Sequence,
    admit_in_order,
    hookimpl,
    room_for,
)


@dataclass
class PriorityConfig(PolicyConfig):
    pass


def by_priority(seq: Sequence) -> int:
    return seq.priority


def displace(view: EngineView) -> list[Sequence]:
    """Running rows to preempt so that the most urgent waiting request can be admitted now.

    Only rows strictly less urgent than that request are candidates, least urgent first and
    newest among equals (it has the least work to redo). Returns [] when the request already
    fits, or when preempting every candidate would still not make room (preempting then
    would only waste work).
    """
    if not view.waiting:
        return []
    head = min(view.waiting, key=by_priority)  # min is stable: the first of the most urgent
    rows = len(view.running)
    tokens = view.step_tokens()
    free = view.free_blocks
    if room_for(view, head, rows, tokens, free) is not None:
        return []
    candidates = sorted(
        (s for s in view.running if not s.finished and s.priority > head.priority),
        key=lambda s: (s.priority, s.admit_order),
        reverse=True,
    )
    victims: list[Sequence] = []
    for seq in candidates:
        victims.append(seq)
        rows -= 1
        tokens -= seq.step_tokens
        free += len(seq.block_table)
        if room_for(view, head, rows, tokens, free) is not None:
            return victims
    return []


class PriorityScheduler(Scheduler):
    """Admits the most urgent request first (lower `priority`) and displaces less urgent rows."""

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_in_order(view, by_priority)

    def displace(self, view: EngineView) -> list[Sequence]:
        """The running rows to preempt for the most urgent waiting request (`displace`
        above); the engine asks before it admits."""
        return displace(view)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("priority", PriorityScheduler, PriorityConfig)
