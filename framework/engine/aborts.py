"""Requests ended from outside the engine, before their stop or their length: the client went
away (`abort`), or a stop string was found in the text (`stop_string`), as a server sees them.

`Aborts.abort` takes a request out in any state with its books closed: one not yet running
holds nothing and ends at once; a running one ends at the start of the next step
(`end_running`), after the step has brought its held tokens home (`Engine.bring_home`), its
blocks back in the pool through the planner's one release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.core.sequence import ABORTED, ENDED_OUTSIDE, STOP_STRING, Sequence, Status
from framework.engine.invariants import InvariantError

if TYPE_CHECKING:
    from framework.engine.counters import Counters
    from framework.engine.held import HeldTokens
    from framework.engine.planner import Planner


class Aborts:
    def __init__(self, planner: Planner, held: HeldTokens, counters: Counters) -> None:
        self.planner = planner
        self.held = held
        self.counters = counters
        # Running requests to end at the start of the next step, with the reason.
        self.aborting: dict[Sequence, str] = {}

    def abort(self, seq: Sequence, reason: str = ABORTED) -> bool:
        """End `seq` before its stop or length. Call it between steps, from the thread that
        steps the engine. Returns whether it ended now (to be announced as finished).

        A request not yet running holds nothing: it ends here. A running one ends at the
        start of the next step, inside that step's books: its held tokens come home first
        (the rows are about to change, as at an eviction), and if they finish it, it
        finishes as it would have; else its blocks go back to the pool (a prefix cache's
        references dropped as at any release) and it is released with `reason`. A request
        that has already finished is left to finish as it does."""
        if reason not in ENDED_OUTSIDE:
            raise ValueError(f"abort reason must be one of {ENDED_OUTSIDE}, got {reason!r}")
        if seq.finish_reason is not None or seq.status in (Status.RELEASED, Status.REJECTED):
            return False
        if seq.status is Status.RUNNING:
            self.aborting[seq] = reason
            return False
        if seq.status not in (Status.PENDING, Status.WAITING):
            # parked or moved: a cluster's hand-off, which a server never starts
            raise ValueError(f"{seq.id} is {seq.status.value}: a hand-off cannot be aborted")
        self.planner.remove(seq)
        if seq.host_table:  # swapped out: its host blocks go back uncopied
            self.planner.release(seq, Status.RELEASED)
        self._end(seq, reason)
        return True

    def forget_all(self) -> None:
        """Drop the aborts still to carry out (their replica is lost: the rows go anyway)."""
        self.aborting.clear()

    def end_running(self) -> None:
        """The running requests `abort` named leave the rows (at the start of a step, their
        held tokens already home); they are announced with the step's finished requests."""
        aborting, self.aborting = self.aborting, {}
        planner = self.planner
        if self.held.count:
            raise InvariantError(f"{len(aborting)} rows end with {self.held.count} steps held")
        for seq, reason in aborting.items():
            if seq.finished or seq not in planner.running:  # its held tokens finished it
                continue
            planner.remove(seq)
            planner.release(seq, Status.RELEASED)
            self._end(seq, reason)
            self.held.announce(seq)

    def _end(self, seq: Sequence, reason: str) -> None:
        seq.status, seq.finish_reason = Status.RELEASED, reason
        seq.finished_at = seq.released_at = self.planner.now()
        if reason == STOP_STRING:
            self.counters.stop_strings += 1
        else:
            self.counters.aborted += 1
