"""KV laid out in contiguous extents (`engine.kv_layout=contiguous`), as engines before paging
kept it: each request's blocks are one run of consecutive blocks, placed by a buddy allocator
(`framework/engine/buddy.py`) when it is admitted, and never grown.

The pool answers the paged pool's questions, and two more that only a layout with extents
raises: whether a set of admissions can be placed (free blocks in total are not enough: they
must stand together), and how much of the free space is external fragmentation (free, but in
pieces too small for the largest extent the allocator could place now).

A step's admissions are placed in order, so whether the next one fits depends on where the
earlier ones went: `would_place` places each on a scratch copy of the allocator, in the order
the scheduler asks, and takes back the trial placements that the scheduler's count of free
blocks shows were not admitted after all.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from framework.engine.block_pool import BlockPool, BlockPoolError
from framework.engine.buddy import BuddyError, BuddyExtents


class ContiguousPool(BlockPool):
    layout = "contiguous"
    forks = False  # a request's extent is its own: samples of one prompt share nothing

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free.clear()  # the buddy allocator keeps the free space
        self.extents = BuddyExtents(num_blocks)
        self._held: dict[str, int] = {}  # owner -> its extent's first block
        # The extent the pool could ever place: its largest free piece while empty.
        self.max_extent = self.extents.largest_free()
        self._trial: BuddyExtents | None = None
        self._placed: list[int] = []  # trial extents' starts, in order
        self._trial_taken = 0

    @property
    def num_free(self) -> int:
        return self.extents.num_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.extents.num_free

    def external_free(self) -> int:
        """Free blocks outside the largest extent that could be placed now."""
        return self.extents.num_free - self.extents.largest_free()

    def allocate(self, owner: str, n: int) -> list[int]:
        if n < 1:
            return []
        if owner in self._held:
            raise BlockPoolError(
                f"{owner} asked for {n} more blocks, but under engine.kv_layout=contiguous a "
                "request's extent is reserved whole at admission and cannot grow"
            )
        try:
            start = self.extents.allocate(n)
        except BuddyError as exc:
            raise BlockPoolError(f"{owner}: {exc}") from None
        owners = self._owner
        for b in range(start, start + n):
            if owners[b] is not None:
                raise BlockPoolError(f"block {b} given to {owner} is still owned by {owners[b]}")
            owners[b] = owner
        self._held[owner] = start
        self.peak_used = max(self.peak_used, self.num_used)
        return list(range(start, start + n))

    def free(self, owner: str, blocks: list[int]) -> None:
        if not blocks:
            return
        start = self._held.get(owner)
        if start != blocks[0] or blocks != list(range(start, start + len(blocks))):
            raise BlockPoolError(f"{owner} freed blocks {blocks[:4]}..., not the extent it holds")
        owners = self._owner
        for b in blocks:
            if owners[b] != owner:
                raise BlockPoolError(f"{owner} freed block {b}, owned by {owners[b]}")
            owners[b] = None
        size = self.extents.free(start)
        if size != len(blocks):
            raise BlockPoolError(f"{owner} freed {len(blocks)} blocks of its extent of {size}")
        del self._held[owner]

    # ---- placing a step's admissions -----------------------------------------------------
    def forget_trials(self) -> None:
        self._trial, self._placed, self._trial_taken = None, [], 0

    def would_place(self, n: int, free_blocks: int) -> bool:
        """Whether an extent of `n` blocks can be placed after this step's earlier
        admissions, which took `num_free - free_blocks` blocks (trial placements beyond
        that were asked about and not admitted: they are taken back, newest first)."""
        if n <= 0:
            return True
        if self._trial is None:
            self._trial = self.extents.copy()
        trial = self._trial
        taken = self.num_free - free_blocks
        while self._placed and self._trial_taken > taken:
            self._trial_taken -= trial.free(self._placed.pop())
        if not trial.fits(n):
            return False
        self._placed.append(trial.allocate(n))
        self._trial_taken += n
        return True

    def can_place(self, sizes: Seq[int]) -> bool:
        """Whether extents of these sizes, placed in order, all fit now."""
        trial = self.extents.copy()
        for n in sizes:
            if n > 0 and not trial.fits(n):
                return False
            if n > 0:
                trial.allocate(n)
        return True

    # ---- inspection ----------------------------------------------------------------------
    def check_tables(self, tables: dict[str, list[int]]) -> None:
        super().check_tables(tables)
        # O(rows): an extent's blocks were laid out in order when it was placed; its two ends
        # and its start's owner say it is still that extent.
        for owner, table in tables.items():
            if table and (
                self._held.get(owner) != table[0] or table[-1] - table[0] + 1 != len(table)
            ):
                raise BlockPoolError(f"{owner}'s blocks are not the one extent it holds")

    def check(self) -> None:
        """The buddy allocator's books are whole, and each extent is its owner's alone."""
        try:
            self.extents.check()
        except BuddyError as exc:
            raise BlockPoolError(str(exc)) from None
        held = self.extents.extents()
        if sorted(held) != sorted(self._held.values()):
            raise BlockPoolError("the extents held and their owners disagree")
        for b, o in enumerate(self._owner):
            start = self._held.get(o) if o is not None else None
            if o is not None and not (start is not None and start <= b < start + held[start]):
                raise BlockPoolError(f"block {b}: owner {o!r} holds no extent over it")
