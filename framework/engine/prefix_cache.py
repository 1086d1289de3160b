"""A block pool that reuses the KV of shared prompt prefixes (vLLM's automatic prefix caching).

A full block whose K/V has been written is published under a chained hash: the parent
block's hash, the block's token ids and a salt (the model and dtype), through BLAKE2b-128, so
a block's hash names its whole prefix. A later request whose prompt starts with the same
full blocks shares them instead of computing them again: each block has a reference count,
one per block table that holds it, and the tokens are compared on every hit as well, so even
a hash collision cannot hand a request another prefix's keys.

A block whose count falls to zero keeps its hash and joins an LRU list of evictable blocks;
it is evicted (its hash dropped) only when the pool needs a block and none is free. A
sequence's blocks join that list tail first, so the end of a prompt is evicted before its
head, and the shared head, which the next request most likely wants, stays longest.

Accounting: free + cached-and-evictable + in use = `num_blocks`; `num_free`, what the engine
and the policies see, counts free and evictable blocks together: both can be handed out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from framework.core.cached_block import CachedBlock
from framework.engine.block_hash import block_hash
from framework.engine.block_pool import BlockPool, BlockPoolError

if TYPE_CHECKING:
    from framework.core.sequence import Sequence
    from framework.engine.counters import Counters


class PrefixCachingPool(BlockPool):
    """`BlockPool` with shared, reference-counted blocks and an LRU of cached free ones.

    `choose`, when given, is a policy's eviction order: called with the evictable blocks
    (least recently freed first) whenever one must go, it returns the block to evict; else
    the least recently freed goes, in O(1)."""

    # `check_tables` spreads the whole check out to about this many table entries a step
    # (about 10 µs; tables this small get it every step): at 4,096 entries a step (0.6 ms) a
    # whole trace, millions of steps of a few rows, took longer than its steps.
    CHECK_ENTRIES_PER_STEP = 64

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        salt: str = "",
        choose: Callable[[list[CachedBlock]], int] | None = None,
    ) -> None:
        super().__init__(num_blocks, block_size)
        self.caches_prefixes = True
        # Lookups (request -> its length, its cached blocks) while `version` stands.
        self.version = 0
        self._looked: dict[Sequence, tuple[int, list[int]]] = {}
        self._looked_at = -1
        self.salt = salt.encode()
        self.choose = choose
        self._depth = [0] * num_blocks
        self._hits = [0] * num_blocks
        self._freed_at = [0] * num_blocks
        self._frees = 0
        self._owners: list[list[str]] = [[] for _ in range(num_blocks)]
        self._hash: list[bytes | None] = [None] * num_blocks  # published blocks only
        # Every held block's chain hash once its tokens are known, published or not (a
        # block whose prefix another block already publishes stays private, but its
        # children's hashes still chain through it).
        self._chain: list[bytes | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable, oldest first
        self._refs = 0  # references held, over all blocks: the per-step check's total
        self.evictions = 0
        # What `check_tables` remembers between steps: per owner, its table as last checked
        # (the list itself, how many entries were checked, the first and the last of them),
        # and the steps since the whole check last ran.
        self._checked: dict[str, tuple[list[int], int, int, int]] = {}
        self._steps_since_full = 0

    # ---- counts --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out: free, or cached and evictable."""
        return len(self._free) + len(self._lru)

    @property
    def num_used(self) -> int:
        """Blocks some block table holds (reference count above zero)."""
        return self.num_blocks - len(self._free) - len(self._lru)

    @property
    def num_cached(self) -> int:
        """Published blocks no table holds: evictable, and reusable until evicted."""
        return len(self._lru)

    def refcount(self, block: int) -> int:
        return len(self._owners[block])

    def references(self) -> int:
        return self._refs

    # ---- lookup and sharing --------------------------------------------------------------
    def match(self, tokens: Seq[int], max_blocks: int) -> list[int]:
        """The cached blocks holding `tokens`' leading full blocks, at most `max_blocks`:
        a chain of hits from the first block, stopping at the first miss."""
        bs = self.block_size
        parent = b""
        hits: list[int] = []
        for i in range(min(max_blocks, len(tokens) // bs)):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = block_hash(parent, chunk, self.salt)
            b = self._by_hash.get(h)
            if b is None or self._tokens[b] != chunk:
                break
            hits.append(b)
            parent = h
        return hits

    def cached_blocks(self, seq: Sequence) -> list[int]:
        """The cached blocks holding `seq`'s leading full blocks. At most (tokens - 1) //
        block_size: the last token is always computed, so the row samples from its own
        forward and never writes into a shared block. The block hashes are the request's
        own, each computed once (`hashes`); a hit's tokens are still compared."""
        if self._looked_at != self.version:
            self._looked.clear()
            self._looked_at = self.version
        length = seq.num_tokens
        found = self._looked.get(seq)
        if found is not None and found[0] == length:
            return found[1]
        bs = self.block_size
        n = (length - 1) // bs
        if n <= 0:
            return []
        hashes = seq.block_hashes if len(seq.block_hashes) >= n else self.hashes(seq, n)
        by_hash, held = self._by_hash, self._tokens
        # A request with no output yet is its prompt: sliced in place (most lookups).
        tokens = seq.spec.prompt_token_ids if not seq.output_token_ids else seq.tokens_from(0)
        hits: list[int] = []
        for i in range(n):
            b = by_hash.get(hashes[i])
            if b is None or held[b] != tuple(tokens[i * bs : (i + 1) * bs]):
                break
            hits.append(b)
        self._looked[seq] = (length, hits)
        return hits

    def hashes(self, seq: Sequence, n: int) -> list[bytes]:
        """`seq`'s chained hashes of its first `n` full blocks, the missing ones computed
        and kept on the request (`Sequence.block_hashes`): a full block's tokens never
        change, so each is hashed once however often the request is looked up."""
        kept = seq.block_hashes
        bs = self.block_size
        parent = kept[-1] if kept else b""
        for i in range(len(kept), n):
            parent = block_hash(parent, seq.tokens_between(i * bs, (i + 1) * bs), self.salt)
            kept.append(parent)
        return kept

    def cached_tokens(self, seq: Sequence) -> int:
        """`seq`'s leading tokens found cached now (whole blocks)."""
        return len(self.cached_blocks(seq)) * self.block_size

    def cached_prefix(self, tokens: Seq[int]) -> int:
        """How many leading tokens of a prompt not yet admitted are cached now (whole
        blocks, the last token always left to compute, as for a sequence): what a router
        reads, without touching the LRU."""
        return len(self.match(tokens, (len(tokens) - 1) // self.block_size)) * self.block_size

    def publish_written(self, running: list[Sequence], counters: Counters) -> None:
        """Full blocks whose K/V this step wrote, and whose tokens the host knows (not the
        held ones), become reusable: published under their chained hash. Each row's
        `prefix_published` is this pool's mark of how far it has published its table."""
        bs = self.block_size
        for seq in running:
            known = min(seq.num_computed, seq.num_tokens)
            if known // bs > seq.prefix_published:
                # Only the positions past what is published: a long prompt is not copied
                # whole each time one more block of it fills.
                first = seq.prefix_published * bs
                seq.prefix_published = self.publish(
                    seq.id,
                    seq.block_table,
                    seq.tokens_between(first, known),
                    seq.prefix_published,
                    first,
                )
        counters.prefix_evictions = self.evictions

    def count_admission(self, seq: Sequence, counters: Counters) -> None:
        """At a first admission the prompt's tokens are looked up and the cached ones found
        are hits; at a re-admission after a preemption they are recomputation saved."""
        if seq.preemptions:
            counters.prefix_recompute_hit_tokens += seq.num_computed
        else:
            counters.prefix_query_tokens += seq.prompt_len
            counters.prefix_hit_tokens += seq.num_computed

    def in_use(self, blocks: Seq[int]) -> int:
        """How many of `blocks` some table holds now (sharing them takes no free block)."""
        return sum(1 for b in blocks if self._owners[b])

    def share(self, owner: str, blocks: Seq[int]) -> None:
        """`owner`'s table takes these cached blocks too: their counts go up, and an
        evictable one leaves the LRU list."""
        self.version += 1
        for b in blocks:
            if self._hash[b] is None:
                raise BlockPoolError(f"{owner} shared block {b}, which holds no published prefix")
            if owner in self._owners[b]:
                raise BlockPoolError(f"{owner} shared block {b} twice")
            if not self._owners[b]:
                del self._lru[b]
            self._owners[b].append(owner)
            self._refs += 1
            self._hits[b] += 1
        self.peak_used = max(self.peak_used, self.num_used)

    def fork(self, owner: str, blocks: Seq[int]) -> None:
        """`owner` takes blocks another table holds (a forked sample), published or not."""
        self.version += 1
        for b in blocks:
            if not self._owners[b] or owner in self._owners[b]:
                raise BlockPoolError(f"{owner} forked block {b}, held by {self._owners[b]}")
            self._owners[b].append(owner)
            self._refs += 1

    def publish(
        self, owner: str, table: Seq[int], tokens: Seq[int], start: int, offset: int = 0
    ) -> int:
        """Publish `owner`'s full blocks from block `start` on whose K/V is written: the
        caller passes the tokens of the written positions only, from position `offset` (at
        most `start` x block_size) on. Returns how many of the table's blocks are now
        published or were already (the next call's `start`). A block whose prefix another
        block already publishes stays private."""
        self.version += 1
        bs = self.block_size
        full = (offset + len(tokens)) // bs
        parent = b""
        if start > 0:
            got = self._chain[table[start - 1]]
            if got is None:
                raise BlockPoolError(f"{owner}'s block {table[start - 1]} has no chain hash")
            parent = got
        for i in range(start, full):
            b = table[i]
            if owner not in self._owners[b]:
                raise BlockPoolError(f"{owner} published block {b}, which it does not hold")
            h = self._chain[b]
            if h is None:
                chunk = tuple(tokens[i * bs - offset : (i + 1) * bs - offset])
                h = block_hash(parent, chunk, self.salt)
                self._chain[b] = h
                if h not in self._by_hash:
                    self._by_hash[h] = b
                    self._hash[b] = h
                    self._tokens[b] = chunk
                    self._depth[b], self._hits[b] = i, 0
            parent = h
        return max(start, full)

    # ---- allocation ----------------------------------------------------------------------
    def allocate(self, owner: str, n: int) -> list[int]:
        self.version += 1
        if n > self.num_free:
            raise BlockPoolError(f"{owner} asked for {n} blocks, only {self.num_free} free")
        blocks = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:  # a cached block, its prefix forgotten: the least recently freed, or the
                b = self._victim()  # eviction order's choice
                self._forget(b)
                self.evictions += 1
            if self._owners[b]:
                raise BlockPoolError(
                    f"block {b} given to {owner} is still held by {self._owners[b]}"
                )
            self._owners[b].append(owner)
            self._refs += 1
            blocks.append(b)
        self.peak_used = max(self.peak_used, self.num_used)
        return blocks

    def free(self, owner: str, blocks: list[int]) -> None:
        """`owner` lets go of its table: tail first, so that its tail is evicted first."""
        self.version += 1
        for b in reversed(blocks):
            if owner not in self._owners[b]:
                raise BlockPoolError(f"{owner} freed block {b}, held by {self._owners[b]}")
            self._owners[b].remove(owner)
            self._refs -= 1
            if self._owners[b]:
                continue
            if self._hash[b] is not None:
                self._lru[b] = None  # newest at the end; evicted from the front
                self._frees += 1
                self._freed_at[b] = self._frees
            else:
                self._chain[b] = None
                self._free.append(b)

    def forget_all(self) -> None:
        """The device is lost: every cached prefix with it, each block free again."""
        super().forget_all()
        self.version += 1  # every lookup made so far is stale
        while self._lru:
            b, _ = self._lru.popitem(last=False)
            self._forget(b)
            self._free.append(b)

    def _victim(self) -> int:
        """The cached block to evict, taken off the LRU list."""
        if self.choose is None:
            b, _ = self._lru.popitem(last=False)
            return b
        cached = [
            CachedBlock(b, self._depth[b], self._hits[b], self._freed_at[b]) for b in self._lru
        ]
        b = self.choose(cached)
        if b not in self._lru:
            raise BlockPoolError(
                f"the eviction order chose block {b!r}, which is not a cached evictable block"
            )
        del self._lru[b]
        return b

    def _forget(self, b: int) -> None:
        h = self._hash[b]
        if h is not None and self._by_hash.get(h) == b:
            del self._by_hash[h]
        self._hash[b] = None
        self._chain[b] = None
        self._tokens[b] = None

    # ---- inspection ----------------------------------------------------------------------
    def owners(self) -> dict[str, list[int]]:
        held: dict[str, list[int]] = {}
        for b, names in enumerate(self._owners):
            for o in names:
                held.setdefault(o, []).append(b)
        return held

    def check(self) -> None:
        """Every block exactly one of free, cached-and-evictable, or held; held blocks not in
        the LRU list; every published hash names its block; free blocks hold no hash."""
        free, lru = set(self._free), set(self._lru)
        if len(free) != len(self._free):
            raise BlockPoolError("a block appears twice in the free list")
        for b in range(self.num_blocks):
            held = bool(self._owners[b])
            kinds = int(b in free) + int(b in lru) + int(held)
            if kinds != 1:
                raise BlockPoolError(
                    f"block {b}: free {b in free}, cached {b in lru}, held by {self._owners[b]}"
                )
            if b in free and (self._hash[b] is not None or self._chain[b] is not None):
                raise BlockPoolError(f"free block {b} still publishes a prefix")
            if b in lru and self._hash[b] is None:
                raise BlockPoolError(f"cached block {b} has no hash")
            if len(set(self._owners[b])) != len(self._owners[b]):
                raise BlockPoolError(f"block {b} held twice by one table: {self._owners[b]}")
        for h, b in self._by_hash.items():
            if self._hash[b] != h or self._chain[b] != h:
                raise BlockPoolError(f"hash of block {b} does not name it")

    def check_tables(self, tables: dict[str, list[int]]) -> None:
        """The per-step check of the running rows' block tables against the pool's books,
        in O(rows + entries new since the last step) (the whole check, O(entries), was most
        of a simulated run's time with long prompts): the entries add up to the references
        the pool holds (a leak is caught at once), and each entry not checked before is
        held by its owner once and is not in the LRU list. A table replaced, shrunk, or
        whose first or last checked block changed is checked whole again. The whole check
        (`check_tables_full`) still runs once the steps since it last ran, times
        `CHECK_ENTRIES_PER_STEP`, reach the entries: a count changed behind an entry already
        checked is caught within entries / `CHECK_ENTRIES_PER_STEP` steps (and by `check()`
        at the end of the run)."""
        total = 0
        for table in tables.values():
            total += len(table)
        self._steps_since_full += 1
        budget = self.CHECK_ENTRIES_PER_STEP
        if self._steps_since_full * budget >= total:
            self.check_tables_full(tables)
            return
        if total != self._refs:
            raise self._leak(total)
        owners, lru = self._owners, self._lru
        before = self._checked
        checked: dict[str, tuple[list[int], int, int, int]] = {}
        for owner, table in tables.items():
            n = len(table)
            start = 0
            prev = before.get(owner)
            if prev is not None:
                seen, m, first, last = prev
                if seen is table and m <= n and table[0] == first and table[m - 1] == last:
                    if m == n:  # nothing new (most rows at most steps)
                        checked[owner] = prev
                        continue
                    start = m
            for b in table[start:]:
                held = owners[b]
                if held.count(owner) != 1:
                    raise BlockPoolError(f"{owner}'s table has block {b}, held by {held}")
                if b in lru:
                    raise BlockPoolError(f"block {b} is held by {owner} and in the LRU list")
            if n:
                checked[owner] = (table, n, table[0], table[-1])
        self._checked = checked  # owners no longer running are forgotten

    def check_tables_full(self, tables: dict[str, list[int]]) -> None:
        """Each block's reference count equals the number of block tables holding it, no
        held block is in the LRU list, and free + cached + in use = the pool. In O(table
        entries), not O(pool): a simulated pool may hold many thousands of blocks."""
        count: dict[int, int] = {}
        for owner, table in tables.items():
            for b in table:
                count[b] = count.get(b, 0) + 1
                if owner not in self._owners[b]:
                    held = self._owners[b]
                    raise BlockPoolError(f"{owner}'s table has block {b}, held by {held}")
                if b in self._lru:
                    raise BlockPoolError(f"block {b} is held by {owner} and in the LRU list")
        for b, n in count.items():
            if n != len(self._owners[b]):
                raise BlockPoolError(
                    f"block {b}: reference count {len(self._owners[b])}, in {n} tables"
                )
        total = sum(count.values())
        if total != self._refs:
            raise self._leak(total)
        if len(self._free) + len(self._lru) + len(count) != self.num_blocks:
            raise BlockPoolError(
                f"free {len(self._free)} + cached {len(self._lru)} + in use {len(count)} != "
                f"the pool's {self.num_blocks} blocks"
            )
        # All of it checked: `check_tables` goes on from here, with only what is new.
        self._checked = {o: (t, len(t), t[0], t[-1]) for o, t in tables.items() if t}
        self._steps_since_full = 0

    def _leak(self, total: int) -> BlockPoolError:
        """A reference that no running table holds: a leak."""
        return BlockPoolError(
            f"running rows hold {total} block references but the pool counts {self._refs} "
            "(a leak, or blocks held by a sequence that is not running)"
        )
