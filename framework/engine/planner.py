"""Step planning: which rows the next forward computes, and how much of each.

    evict -> grow (preempt while the pool is dry) -> displace -> choose admissions -> admit

The policies decide each part through a view; the planner checks every decision against the
contract and the budgets, then applies it: blocks freed and allocated, requests moved
between the queues. Its result, a `StepPlan`, is what the batch build reads. Whenever the
rows are about to change, every held token comes home first (`HeldTokens.drain_all`).

The planner is also the engine's side of the views' questions (`ViewRules`): a chunk as the
scheduler gives it, a prefix lookup, the allocator's veto. A lookup's finding for a waiting
request is the engine's to record, and is recorded here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from framework.api.guard import Guarded
from framework.api.policy import EngineView, PolicyError, QueueView
from framework.engine.block_pool import BlockPool
from framework.engine.clock import Clock
from framework.engine.counters import Counters, StepStats
from framework.engine.frozen import make_frozen
from framework.engine.held import HeldTokens
from framework.engine.invariants import InvariantError
from framework.engine.phases import PhaseTimer
from framework.engine.sequence import Sequence, Status


@dataclass(frozen=True)
class HandOff:
    """A request whose part on this replica is done (a prefill replica's, at its first
    token): when it left the running rows, its blocks still held, and the forward seconds
    of the step that sampled its token (what a layer-wise transfer overlaps)."""

    seq: Sequence
    at: float
    forward_s: float


@dataclass
class StepPlan:
    """What this step's planning did, and what the batch build needs of it."""

    evicted: int = 0
    preempted: int = 0
    admitted: int = 0
    # The rows that compute less than all they have pending (chunked prefill), and how much.
    chunks: dict[Sequence, int] = field(default_factory=dict)


def any_finished(running: list[Sequence]) -> bool:
    """Whether a running row is `finished` (inlined: it runs every step)."""
    for s in running:
        if s.finish_reason is not None or len(s.output_token_ids) + s.num_held >= s._max_tokens:
            return True
    return False


class Planner:
    def __init__(
        self,
        waiting: deque[Sequence],
        running: list[Sequence],
        pool: BlockPool,
        policies: Any,
        limits: Any,
        counters: Counters,
        output: HeldTokens,
        steps: list[StepStats],
        clock: Clock,
    ) -> None:
        self.waiting = waiting
        self.running = running
        self.pool = pool
        self.p = policies
        self.limits = limits
        self.counters = counters
        self.output = output
        self.steps = steps
        # Nothing here refers back to the engine: an engine is freed (its KV cache with it)
        # as soon as its last reference goes, not at the garbage collector's next pass.
        self.clock = clock
        self.displaces = True  # whether the scheduler has a `displace` of its own
        self.chunks = True  # whether it has a `chunk` of its own
        self._admit_counter = 0
        # Waiting requests whose `cached_prefix` a lookup set: cleared at the next choice of
        # admissions, so a finding never outlives the step it was made in (the blocks it
        # counted may be evicted since).
        self._hinted: list[Sequence] = []
        # A cluster's prefill/decode disaggregation (each empty otherwise). Here a request's
        # blocks are held either by a running row or by one of these:
        # - `sending`: handed off after its part here (its first token), its KV not yet sent;
        # - `receiving`: blocks reserved for a request's KV coming from a prefill replica,
        #   in flight or `landed` (arrived, at that time), until it joins the running rows.
        self.sending: dict[str, Sequence] = {}
        self.outbox: list[HandOff] = []  # hand-offs the cluster has not taken yet
        self.receiving: dict[str, Sequence] = {}
        self.landed: deque[tuple[float, Sequence]] = deque()

    def now(self) -> float:
        return self.clock.now()

    def fail(self, group: str, msg: str) -> PolicyError:
        """The error a decision that breaks the contract raises, naming the policy."""
        who = self.p.providers.get(group)
        tag = f" ({who})" if who else ""
        return PolicyError(f"{group} policy {self.p.names.get(group, '?')!r}{tag}: {msg}")

    # ---- the plan --------------------------------------------------------------------
    def plan(self, timer: PhaseTimer) -> StepPlan:
        plan = StepPlan()
        plan.evicted = self.evict()
        if self.landed:
            self.join_landed()
        timer.lap("schedule")
        plan.preempted = self.grow()
        timer.lap("allocate")
        plan.preempted += self.displace()
        admitted, plan.chunks = self.choose()
        timer.lap("schedule")
        self.admit(admitted)
        timer.lap("allocate")
        plan.admitted = len(admitted)
        return plan

    # ---- views and their rules -------------------------------------------------------
    def view(self, planned: int | None = None) -> EngineView:
        return make_frozen(
            EngineView,
            now=self.now(),
            step=len(self.steps),
            waiting=QueueView(self.waiting),
            running=tuple(self.running),
            free_blocks=self.pool.num_free,
            block_size=self.pool.block_size,
            num_blocks=self.pool.num_blocks,
            max_num_seqs=self.limits.max_num_seqs,
            max_num_batched_tokens=self.limits.max_num_batched_tokens,
            blocks_to_admit=self.price,
            last_step=self.steps[-1] if self.steps else None,
            rules=self,
            planned=planned,
        )

    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        """`view.chunk`: under a prefix cache, what `seq` finds cached is left out first."""
        self.cached_tokens(seq)
        if not self.chunks:
            return seq.step_tokens
        return self.p.scheduler.chunk(view, seq, budget)

    def cached_tokens(self, seq: Sequence) -> int:
        """`seq`'s leading tokens in the prefix cache now. A waiting request's forward would
        skip them, so its `step_tokens` leaves them out from here until its admission."""
        n = self.pool.cached_tokens(seq)
        if seq.status is Status.WAITING and seq.cached_prefix != n:
            seq.cached_prefix = n
            self._hinted.append(seq)
        return n

    def admits(self, view: EngineView, seq: Sequence, free_blocks: int) -> bool:
        return self.p.allocator.admits(view, seq, free_blocks)

    def price(self, seq: Sequence) -> int:
        """Free blocks admitting `seq` takes: the allocator's price, less the cached blocks
        it shares that another table holds already (those cost nothing; an evictable cached
        block costs one, like a fresh one)."""
        n = self.p.allocator.blocks_to_admit(seq, self.pool.block_size)
        return n - self.pool.in_use(self.pool.cached_blocks(seq))

    # ---- hand-offs (prefill/decode disaggregation) ------------------------------------
    def drain_all(self) -> None:
        """Every held token home; a request whose part here that ends leaves the rows."""
        self.output.drain_all()
        self.hand_off()

    def hand_off(self) -> None:
        """Rows whose part here is done though they owe more tokens (`HeldTokens.handed`)
        leave the running rows, their blocks still held, for the cluster to move: a
        hand-off is not an eviction, so no scheduler is asked."""
        handed = self.output.handed
        if not handed:
            return
        now = self.now()
        for seq, forward_s in handed:
            self.running.remove(seq)
            self.sending[seq.id] = seq
            self.outbox.append(HandOff(seq, now, forward_s))
        handed.clear()

    def join_landed(self) -> None:
        """Requests whose KV has landed join the running rows as decode rows while a row is
        free, ahead of any admission: their blocks are theirs since the reservation, and
        their prompt is computed (it came over the link)."""
        now = self.now()
        landed = self.landed
        if not (landed[0][0] <= now and len(self.running) < self.limits.max_num_seqs):
            return
        self.drain_all()  # the rows change: held tokens home first
        while landed and landed[0][0] <= now and len(self.running) < self.limits.max_num_seqs:
            _, seq = landed.popleft()
            del self.receiving[seq.id]
            seq.status = Status.RUNNING
            seq.admit_order = self._admit_counter
            self._admit_counter += 1
            self.running.append(seq)

    # ---- evict, grow, displace -------------------------------------------------------
    def evict(self) -> int:
        """Release the finished rows the scheduler names. Their held tokens come home first
        (the rows change), which may reveal more finished rows: the scheduler is asked again.
        It is asked only when a row has finished: with none, there is nothing it may name."""
        if not any_finished(self.running):
            return 0
        evict = self.p.scheduler.evict(self.view())
        if evict and self.output.steps:
            self.drain_all()
            evict = self.p.scheduler.evict(self.view())
        for seq in evict:
            if seq not in self.running or not seq.finished:
                raise self.fail("scheduler", f"evicted {seq.id}, not a finished running row")
        for seq in evict:
            self.running.remove(seq)
            self.release(seq, Status.RELEASED, self.now())
        return len(evict)

    def release(self, seq: Sequence, status: Status, at: float | None = None) -> None:
        """The one way a sequence gives its blocks back, whatever ends its hold: finishing,
        preemption, abort, a hand-off's KV sent. Its blocks go back to the pool (a prefix
        cache drops its references), its table is emptied and its status set; `at` stamps
        when it left this replica (a preempted one has not: it waits to come back)."""
        self.pool.free(seq.id, seq.block_table)
        seq.block_table = []
        seq.status = status
        if at is not None:
            seq.released_at = at

    def grow(self) -> int:
        """Give running rows the blocks this step writes into; preempt while the pool is dry.
        Held tokens are already in the cache, so a row's lookahead is its `num_held`."""
        preempted = 0
        bs = self.pool.block_size
        allocator = self.p.allocator
        guarded = isinstance(allocator, Guarded)  # guarded once around the whole loop
        grow = allocator.unguarded("blocks_to_grow") if guarded else allocator.blocks_to_grow
        while True:
            try:
                # Only the rows that need blocks: most rows cross no block boundary in a step.
                need = [
                    (s, n)
                    for s in self.running
                    if s.finish_reason is None  # `not s.finished`, inlined
                    and len(s.output_token_ids) + s.num_held < s._max_tokens
                    and (n := grow(s, bs, s.num_held)) > 0
                ]
            except PolicyError:
                raise
            except Exception as exc:
                if not guarded:
                    raise
                raise allocator.failure("blocks_to_grow", exc) from exc
            short = sum(n for _, n in need) - self.pool.num_free
            if short <= 0:
                break
            if self.output.steps:  # the rows are about to change: every held token home first
                self.drain_all()
                continue
            victims = self.p.preemption.victims(self.view(), short)
            if not victims:
                raise self.fail("preemption", f"named no victim; the pool is {short} blocks short")
            for v in victims:
                if v not in self.running or v.finished:
                    raise self.fail("preemption", f"named {v.id}, not an unfinished running row")
                self.preempt(v)
                preempted += 1
        for seq, n in need:
            seq.block_table += self.pool.allocate(seq.id, n)
        # Whether every row got the blocks its next write needs is checked as the batch build
        # maps each written position to its slot (`short_table`).
        return preempted

    def displace(self) -> int:
        """Preempt the running rows the scheduler displaces for a waiting request."""
        if not self.displaces:
            return 0
        victims = self.p.scheduler.displace(self.view())
        if victims and self.output.steps:  # rows change: held tokens home first, ask again
            self.drain_all()
            victims = self.p.scheduler.displace(self.view())
        for v in victims:
            if v not in self.running or v.finished:
                raise self.fail("scheduler", f"displaced {v.id}, not an unfinished running row")
        for v in victims:
            self.preempt(v)
        return len(victims)

    def preempt(self, seq: Sequence) -> None:
        if seq.num_held:  # growth drains before it preempts: nothing may be in flight here
            raise InvariantError(f"{seq.id} preempted with {seq.num_held} tokens in flight")
        self.running.remove(seq)
        self.release(seq, Status.WAITING)
        seq.prefix_published = 0
        self.counters.preemptions += 1
        self.counters.recomputed_tokens += seq.num_computed
        seq.num_computed = 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def short_table(self, seq: Sequence, exc: IndexError) -> Exception:
        """What an IndexError while building `seq`'s row means: the allocator left it too
        few blocks for the positions this step writes (the original error, if not)."""
        if len(seq.block_table) * self.pool.block_size >= seq.total_len:
            return exc
        return self.fail(
            "allocator",
            f"left {seq.id} {len(seq.block_table)} blocks for {seq.total_len} cached tokens "
            f"({seq.num_held} held on the device)",
        )

    # ---- admissions ------------------------------------------------------------------
    def choose(self) -> tuple[list[Sequence], dict[Sequence, int]]:
        """The scheduler's admissions, checked against every budget, and the step's chunks."""
        for seq in self._hinted:
            if seq.status is Status.WAITING:
                seq.cached_prefix = 0
        self._hinted.clear()
        chunks, tokens = self._plan_running()
        view = self.view(planned=tokens)
        admit = self.p.scheduler.admit(view)
        rows = len(self.running)
        blocks = 0
        chosen: set[int] = set()  # by status, not by a scan: the queue may hold thousands
        for seq in admit:
            if seq.status is not Status.WAITING or id(seq) in chosen:
                raise self.fail("scheduler", f"admitted {seq.id}, which is not waiting")
            chosen.add(id(seq))
            rows += 1
            self.cached_tokens(seq)  # charged what it does not find cached (as it is now)
            n = self._chunk(view, seq, self.limits.max_num_batched_tokens - tokens)
            if n != seq.step_tokens:
                chunks[seq] = n
            tokens += n
            if not self.p.allocator.admits(view, seq, self.pool.num_free - blocks):
                raise self.fail("scheduler", f"admitted {seq.id}, which the allocator declines")
            blocks += self.price(seq)
        lim = self.limits
        if rows > lim.max_num_seqs:
            raise self.fail(
                "scheduler",
                f"batch of {rows} rows exceeds engine.max_num_seqs = {lim.max_num_seqs}",
            )
        if tokens > lim.max_num_batched_tokens:
            raise self.fail(
                "scheduler",
                f"step of {tokens} tokens exceeds engine.max_num_batched_tokens = "
                f"{lim.max_num_batched_tokens}",
            )
        if blocks > self.pool.num_free:
            raise self.fail(
                "scheduler", f"admissions need {blocks} blocks, {self.pool.num_free} are free"
            )
        return admit, chunks

    def _chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        """The scheduler's chunk of `seq`'s pending tokens, checked."""
        n = self.p.scheduler.chunk(view, seq, budget)
        if not isinstance(n, int) or not 1 <= n <= seq.step_tokens:
            raise self.fail(
                "scheduler",
                f"chunked {seq.id} to {n!r} tokens; it has {seq.step_tokens} pending (1.."
                f"{seq.step_tokens})",
            )
        return n

    def _plan_running(self) -> tuple[dict[Sequence, int], int]:
        """The running rows' tokens in the next forward, in Sarathi's order: every decode
        (and finished) row its one token first, then each row part way through a chunked
        prefill, in running order, what the scheduler's `chunk` gives it from the rest of
        the budget. Returns the chunks that are not whole, and the rows' total."""
        # `s.step_tokens > 1`, inlined: a row not yet sampling with more than one pending.
        partial = [
            s for s in self.running if s.num_computed < s.prefill_end - 1 and s.step_tokens > 1
        ]
        tokens = len(self.running)
        chunks: dict[Sequence, int] = {}
        if not partial:
            return chunks, tokens
        view = self.view()
        for seq in partial:
            # One token of each row is already counted; the row may take the rest left.
            n = self._chunk(view, seq, self.limits.max_num_batched_tokens - tokens + 1)
            tokens += n - 1
            if n != seq.step_tokens:
                chunks[seq] = n
        return chunks, tokens

    def admit(self, admit: list[Sequence]) -> None:
        """The chosen requests join the running rows, with their blocks."""
        if admit:  # the rows change: held tokens must reach their requests first
            self.drain_all()
        # Every admission's cached blocks are taken before any fresh block is handed out:
        # a fresh allocation may evict a cached block nobody holds, and one that a later
        # admission of this step was charged as cached must still be there for it.
        # Each takes exactly the cached blocks it was charged for (a block published since
        # would change the chunk the scheduler chose).
        bs = self.pool.block_size
        hits = [self.pool.cached_blocks(seq)[: seq.cached_prefix // bs] for seq in admit]
        for seq, held in zip(admit, hits, strict=True):
            if len(held) * bs != seq.cached_prefix:
                raise RuntimeError(
                    f"engine: {seq.id} was charged for {seq.cached_prefix} cached tokens "
                    f"and finds {len(held) * bs}"
                )
            self.pool.share(seq.id, held)
        for seq, held in zip(admit, hits, strict=True):
            self.waiting.remove(seq)
            n = self.p.allocator.blocks_to_admit(seq, bs)
            seq.block_table = held + self.pool.allocate(seq.id, max(0, n - len(held)))
            seq.cached_prefix = 0
            if held:  # its forward starts after the cached blocks, reading them
                seq.num_computed = len(held) * bs
            seq.prefix_published = len(held)
            self.pool.count_admission(seq, self.counters)
            if max(n, len(seq.block_table)) * bs < seq.num_tokens:
                raise self.fail(
                    "allocator", f"gave {seq.id} {n} blocks for {seq.num_tokens} tokens"
                )
            seq.status = Status.RUNNING
            seq.prefill_end = seq.total_len  # all of it is prefill, until the row samples
            seq.admit_order = self._admit_counter
            self._admit_counter += 1
            if seq.admitted_at is None:
                seq.admitted_at = self.now()
            self.running.append(seq)
