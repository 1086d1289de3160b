"""A request's samples forking over its prompt's blocks (`framework.core.sample_group`): the
samples still waiting in their groups, and the blocks each fork takes and copies.

The planner owns the queues and asks this object two things: which held samples may join
the waiting queue now (`ready`), and, at an admission that forks, which blocks the sample
shares and which it copies (`shared`, `fork`). The copies of a step reach the executor
through its plan (`StepPlan.copies`), made before the forward.
"""

from __future__ import annotations

from framework.core.sequence import SampleGroup, Sequence, Status
from framework.engine.block_pool import BlockPool
from framework.engine.counters import Counters


class Forks:
    def __init__(self, pool: BlockPool, counters: Counters) -> None:
        self.pool = pool
        self.counters = counters
        self.groups: list[SampleGroup] = []  # with samples not yet released to wait
        self.copies: list[tuple[int, int]] = []  # this step's (from, to) blocks

    def __bool__(self) -> bool:
        return bool(self.groups)

    def hold(self, group: SampleGroup) -> None:
        """`group`'s samples but the leader wait here until they can fork from it."""
        for seq in group.unforked:
            seq.status = Status.PENDING
        self.groups.append(group)

    def ready(self) -> list[Sequence]:
        """The held samples that may wait for admission now, in index order: those whose
        leader runs with its prompt computed up to its last token (each then forks from
        it at admission: `Lookups.fork_source`), or has left the rows without coming back
        (it finished or moved; each computes its prompt then). They leave their group."""
        out: list[Sequence] = []
        for group in list(self.groups):
            lead = group.leader
            if lead.status in (Status.PENDING, Status.WAITING):
                continue
            if lead.status is Status.RUNNING and lead.num_computed < lead.prompt_len - 1:
                continue
            self.groups.remove(group)
            out += group.unforked
            group.unforked.clear()
        return out

    def remove(self, seq: Sequence) -> bool:
        """`seq` leaves its group if it is held there (an abort): True if it was."""
        group = seq.group
        if group is None or seq not in group.unforked:
            return False
        group.unforked.remove(seq)
        if not group.unforked:
            self.groups.remove(group)
        return True

    def empty(self) -> list[Sequence]:
        """Every held sample, its group forgotten (a replica's failure)."""
        out = [s for g in self.groups for s in g.unforked]
        for group in self.groups:
            group.unforked.clear()
        self.groups.clear()
        return out

    def fork(self, seq: Sequence, source: Sequence, shared: int) -> int:
        """`seq`, admitted with its first `shared` blocks `source`'s: the block holding the
        rest of the prompt before its last token, if any, is copied into `seq`'s first own
        block (copy on write: `seq` writes the last token there). Returns the positions it
        reads and does not compute."""
        reads = seq.prompt_len - 1
        counters = self.counters
        if reads > shared * self.pool.block_size:
            self.copies.append((source.block_table[shared], seq.block_table[shared]))
            counters.cow_blocks += 1
        counters.forks += 1
        counters.forked_blocks += shared
        seq.num_computed = reads
        seq.prefix_published = 0  # a prefix cache publishes its blocks from the first
        return reads

    def take_copies(self) -> tuple[tuple[int, int], ...]:
        """The step's copies, handed to its plan once."""
        copies, self.copies = tuple(self.copies), []
        return copies
