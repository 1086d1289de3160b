"""The KV block pool: which physical block belongs to which sequence.

Ownership is recorded per block, so a double allocation or a free of a block one does not
own is caught at the moment it happens, naming both parties, instead of surfacing later
as one request reading another's keys.

The pool is also where prefix caching lives, behind one interface: this pool caches nothing
(a lookup finds no block, publishing keeps none), `PrefixCachingPool` shares published
blocks. The engine asks either the same questions and never asks which one it has.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framework.core.sequence import Sequence
    from framework.engine.counters import Counters


class BlockPoolError(RuntimeError):
    """A block was allocated twice, freed by a non-owner, or the pool ran dry."""


class BlockPool:
    layout = "paged"  # any free block serves any request (`ContiguousPool`: extents)
    forks = True  # a table may take blocks another holds (`fork`); extents cannot share
    evictions = 0  # cached blocks whose prefix was dropped for a fresh allocation
    caches_prefixes = False  # a lookup finds nothing here: no block is ever cached

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"engine.num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"engine.block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._owner: list[str | None] = [None] * num_blocks
        # Blocks two or more tables hold (a request's samples, forked): all their holders,
        # the first also in `_owner`. Empty unless requests fork, so the hot paths test it
        # once.
        self._shared: dict[int, list[str]] = {}
        self._extra_refs = 0  # holders past the first, over the shared blocks
        self.peak_used = 0
        self.max_extent = num_blocks  # the most blocks one request could ever be given

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` slots."""
        return -(-num_tokens // self.block_size)

    def allocate(self, owner: str, n: int) -> list[int]:
        free, owners = self._free, self._owner
        if n > len(free):
            raise BlockPoolError(f"{owner} asked for {n} blocks, only {len(free)} free")
        # Most calls are one block (a running row crossing into its next block, every step
        # for some rows at trace scale): locals, and no list built around a single pop.
        blocks = [free.popleft()] if n == 1 else [free.popleft() for _ in range(n)]
        for b in blocks:
            if owners[b] is not None:
                raise BlockPoolError(f"block {b} given to {owner} is still owned by {owners[b]}")
            owners[b] = owner
        used = self.num_blocks - len(free)
        if used > self.peak_used:
            self.peak_used = used
        return blocks

    def free(self, owner: str, blocks: list[int]) -> None:
        """`owner` lets go of its blocks: each goes back to the free list unless another
        table still holds it (a fork's shared prompt)."""
        owners, shared = self._owner, self._shared
        if shared:
            blocks = [b for b in blocks if not self._unshare(owner, b)]
        for b in blocks:
            if owners[b] != owner:
                raise BlockPoolError(f"{owner} freed block {b}, owned by {owners[b]}")
            owners[b] = None
        self._free.extend(blocks)

    def _unshare(self, owner: str, b: int) -> bool:
        """`owner` drops its hold on `b` if others hold it too: True when `b` stays held."""
        holders = self._shared.get(b)
        if holders is None:
            return False
        if owner not in holders:
            raise BlockPoolError(f"{owner} freed block {b}, held by {holders}")
        holders.remove(owner)
        self._extra_refs -= 1
        self._owner[b] = holders[0]
        if len(holders) == 1:
            del self._shared[b]
        return True

    def fork(self, owner: str, blocks: Seq[int]) -> None:
        """`owner`'s table takes blocks another table holds (a sample forked from its
        request's leader): each block's count goes up by one; none is copied or freed
        until its last holder lets go. Only blocks nobody writes again are forked (the
        prompt's full blocks; `framework.core.sample_group`)."""
        owners, shared = self._owner, self._shared
        for b in blocks:
            first = owners[b]
            if first is None:
                raise BlockPoolError(f"{owner} forked block {b}, which is free")
            holders = shared.get(b) or [first]
            if owner in holders:
                raise BlockPoolError(f"{owner} forked block {b}, which it holds already")
            shared[b] = [*holders, owner]
            self._extra_refs += 1

    def retable(self, moves: Seq[tuple[str, Seq[int], Seq[int]]]) -> None:
        """Each (owner, old, new): the owner's table goes from `old` to `new`, blocks other
        tables hold (beams that continue each other's hypotheses take their blocks). Every
        reference on a block new to its owner is taken before any on a block it leaves is
        dropped (freed where that was the last), so no block passes through the free list."""
        for owner, old, new in moves:
            had = set(old)
            self.fork(owner, [b for b in new if b not in had])
        for owner, old, new in moves:
            keep = set(new)
            self.free(owner, [b for b in old if b not in keep])

    def copy_on_write(self, owner: str, block: int) -> int:
        """`owner` stops holding `block`, which other tables hold too, for a fresh block of
        its own (into which the caller copies it before writing). Returns the fresh block."""
        if self.refcount(block) < 2:
            raise BlockPoolError(f"{owner} copied block {block}, which only it holds")
        self.free(owner, [block])
        (fresh,) = self.allocate(owner, 1)
        return fresh

    def refcount(self, block: int) -> int:
        """How many tables hold `block`."""
        holders = self._shared.get(block)
        if holders is not None:
            return len(holders)
        return 0 if self._owner[block] is None else 1

    # ---- placing a step's admissions: any free blocks will do ----------------------------
    def forget_all(self) -> None:
        """The device is lost (a replica's failure): no block may still be held, and nothing
        it cached survives (a pool that caches nothing has nothing to forget)."""
        if self.num_used:
            raise BlockPoolError(f"{self.num_used} blocks still held when the KV was lost")

    def forget_trials(self) -> None:
        """A new choice of admissions begins (a layout of extents places them on trial)."""

    def would_place(self, n: int, free_blocks: int) -> bool:
        """Whether `n` more blocks can be given with `free_blocks` left after this step's
        earlier admissions: here, whenever there are that many."""
        return n <= free_blocks

    def can_place(self, sizes: Seq[int]) -> bool:
        """Whether admissions of these sizes, in order, can all be given their blocks now."""
        return sum(sizes) <= self.num_free

    def external_free(self) -> int:
        """Free blocks no request could be given (external fragmentation): none when any
        free block serves any request."""
        return 0

    # ---- the prefix cache's interface: a pool that caches nothing ------------------------
    def cached_blocks(self, seq: Sequence) -> list[int]:
        """The cached blocks holding `seq`'s leading full blocks: none here."""
        return []

    def cached_tokens(self, seq: Sequence) -> int:
        """How many of `seq`'s leading tokens are cached: none here."""
        return 0

    def cached_prefix(self, tokens: Seq[int]) -> int:
        """How many leading tokens of a prompt not yet admitted are cached: none here."""
        return 0

    def in_use(self, blocks: Seq[int]) -> int:
        """How many of the cached `blocks` some table holds: none are cached here."""
        return 0

    def share(self, owner: str, blocks: Seq[int]) -> None:
        """`owner`'s table takes cached blocks: there are none to take here."""
        if blocks:
            raise BlockPoolError(f"{owner} shared blocks {list(blocks)} of a pool that caches none")

    def publish_written(self, running: list[Sequence], counters: Counters) -> None:
        """The running rows' written full blocks become reusable: nothing is kept here."""

    def count_admission(self, seq: Sequence, counters: Counters) -> None:
        """An admission's prefix lookup, for the run's hit rate: nothing is looked up here."""

    # ---- inspection ----------------------------------------------------------------------
    def owners(self) -> dict[str, list[int]]:
        held: dict[str, list[int]] = {}
        for b, o in enumerate(self._owner):
            for holder in self._shared.get(b, [o] if o is not None else []):
                held.setdefault(holder, []).append(b)
        return held

    def references(self) -> int:
        """Block references the tables hold: the used blocks, plus one for every extra
        holder of a shared block."""
        return self.num_used + self._extra_refs

    def check_tables(self, tables: dict[str, list[int]]) -> None:
        """The running rows' block tables are exactly what the pool says is held: each
        table entry is one reference, so the entries add up to the references."""
        owned = sum(len(t) for t in tables.values())
        if owned != (refs := self.references()):
            raise BlockPoolError(
                f"running rows hold {owned} block references but the pool counts {refs} "
                "(a leak, or blocks held by a sequence that is not running)"
            )

    def check(self) -> None:
        """Free list and ownership agree: every block is exactly one of free or owned."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise BlockPoolError("a block appears twice in the free list")
        for b, o in enumerate(self._owner):
            if (o is None) != (b in free):
                raise BlockPoolError(f"block {b}: owner {o!r} but in free list: {b in free}")
        if self._extra_refs != sum(len(h) - 1 for h in self._shared.values()):
            raise BlockPoolError(f"{self._extra_refs} extra references counted, not the holders'")
        for b, holders in self._shared.items():
            if (
                len(holders) < 2
                or len(set(holders)) != len(holders)
                or self._owner[b] not in holders
            ):
                raise BlockPoolError(
                    f"shared block {b}: holders {holders}, owner {self._owner[b]!r}"
                )
