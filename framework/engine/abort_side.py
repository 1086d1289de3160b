"""A request ended from outside the engine, before its stop or its length: its client went
away (`abort`), or a stop string was found in its text (`stop_string`), as a server sees
them. `Engine.abort` takes it out in any state with its books closed: a running one at the
start of the next step, after its held tokens have come home, its blocks back in the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.engine.sequence import ABORTED, ENDED_OUTSIDE, STOP_STRING, Sequence, Status

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable

    from framework.engine.counters import Counters
    from framework.engine.held import HeldTokens
    from framework.engine.planner import Planner


class AbortSide:
    """Mixed into `Engine`, whose attributes these are."""

    planner: Planner
    output: HeldTokens
    counters: Counters
    pending: deque[Sequence]
    waiting: deque[Sequence]
    running: list[Sequence]
    # Running requests to end at the start of the next step (`abort`), with the reason.
    aborting: dict[Sequence, str]
    now: Callable[[], float]
    _notify: Callable[[list[Sequence]], None]

    def abort(self, seq: Sequence, reason: str = ABORTED) -> None:
        """End `seq` before its stop or length: its client went away (`abort`), or a stop
        string was found in its text (`stop_string`). Call it between steps, from the thread
        that steps the engine.

        A request not yet running holds nothing: it ends here. A running one ends at the
        start of the next step, inside that step's books: its held tokens come home first
        (the rows are about to change, as at an eviction), and if they finish it, it
        finishes as it would have; else its blocks go back to the pool (a prefix cache's
        references dropped as at any release) and it is released with `reason`. A request
        that has already finished is left to finish as it does."""
        if reason not in ENDED_OUTSIDE:
            raise ValueError(f"abort reason must be one of {ENDED_OUTSIDE}, got {reason!r}")
        if seq.finish_reason is not None or seq.status in (Status.RELEASED, Status.REJECTED):
            return
        if seq.status is Status.PENDING:
            self.pending.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status is Status.RUNNING:
            self.aborting[seq] = reason
            return
        else:  # sending or receiving: a cluster's hand-off, which a server never starts
            raise ValueError(f"{seq.id} is {seq.status.value}: a hand-off cannot be aborted")
        self._end(seq, reason)
        self._notify([seq])

    def _abort_running(self) -> None:
        """The running requests `abort` named leave the rows (at the start of a step)."""
        aborting, self.aborting = self.aborting, {}
        if self.output.steps:  # the rows change: every held token reaches its request first
            self.planner.drain_all()
        for seq, reason in aborting.items():
            if seq.finished or seq not in self.running:  # its held tokens finished it
                continue
            self.running.remove(seq)
            self.planner.release(seq, Status.RELEASED)
            self._end(seq, reason)
            self.output.finished.append(seq)  # announced with the step's finished requests

    def _end(self, seq: Sequence, reason: str) -> None:
        seq.status, seq.finish_reason = Status.RELEASED, reason
        seq.finished_at = seq.released_at = self.now()
        if reason == STOP_STRING:
            self.counters.stop_strings += 1
        else:
            self.counters.aborted += 1
