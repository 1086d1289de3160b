"""Which sequences the executor keeps state for between steps, so that it learns each one's
start and end from the batch alone: today a penalized sequence's token counts
(`framework.executors.penalties`).

As vLLM's runner learns of new and finished requests from its scheduler's output, the
executor gets a sequence's tokens so far on the first row it computes (`Row.history`), and
its id once it has left this engine for good (`StepBatch.ended`). Between the two, its
counts grow on the device from the sampled tokens themselves: nothing is sent again, and
nothing is read back. A preempted sequence keeps its state: it comes back with the same
tokens.
"""

from __future__ import annotations

from framework.core.sequence import Sequence, Status
from framework.engine.invariants import InvariantError

# Where a sequence is when this engine will compute no more rows of it.
GONE = (Status.RELEASED, Status.REJECTED, Status.MOVED)


class SequenceStates:
    def __init__(self) -> None:
        self.live: dict[str, Sequence] = {}

    def __bool__(self) -> bool:
        return bool(self.live)

    def history(self, seq: Sequence) -> tuple[list[int], list[int]] | None:
        """`seq`'s tokens so far, the first time a row of it is built (then None). A copy
        of a sequence taken over from another engine is a new start, tokens and all."""
        if self.live.get(seq.id) is seq:
            return None
        if seq.num_held:  # they would be missing from its counts
            raise InvariantError(f"{seq.id} starts its state with {seq.num_held} tokens held")
        self.live[seq.id] = seq
        return seq.spec.prompt_token_ids, list(seq.output_token_ids)

    def ended(self) -> tuple[str, ...]:
        """The sequences that left for good since the last call: the executor drops them."""
        gone = tuple(i for i, s in self.live.items() if s.status in GONE)
        for i in gone:
            del self.live[i]
        return gone
