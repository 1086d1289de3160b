"""Step planning: which rows the next forward computes, and how much of each.

    evict -> grow (preempt while the pool is dry) -> displace -> choose admissions -> admit

The planner is the one owner of the queues: requests not yet arrived (`pending`), arrived and
not running (`waiting`), the rows of the next forward (`running`), and a request's samples
waiting to fork from their leader (`forking`). Every move between them, and every release
of a request's blocks (`release`), happens here; the abort and hand-off books ask it to move
what they end or send.

The policies decide each part of a step's plan through a view; the planner checks every
decision against the contract and the budgets, then applies it. Its result, a `StepPlan` made
once at the end, is all the batch build reads. `Lookups` answers a view's questions (a chunk,
a prefix lookup, a fork's source, the allocator's veto) and holds no queue.

The planner never brings a held token home itself: whenever the rows are about to change
while tokens are on the device, `plan` yields, the step brings every held token to its
request (`Engine.bring_home`) and resumes it, and the planner looks again at what they changed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TypeVar

from framework.api.policy import PREEMPTION_MODES, SWAP, EngineView, PolicyError, QueueView
from framework.core.sequence import SampleGroup, Sequence, Status
from framework.engine.batch import NO_SWAPS
from framework.engine.beams import Beams
from framework.engine.block_pool import BlockPool
from framework.engine.clock import Clock
from framework.engine.counters import Counters
from framework.engine.forks import Forks
from framework.engine.held import HeldTokens
from framework.engine.host_tier import HostTier
from framework.engine.invariants import InvariantError
from framework.engine.kv_usage import overhang
from framework.engine.lookups import Lookups
from framework.engine.parking import Parking
from framework.engine.phases import PhaseTimer
from framework.engine.settings import GuardedPolicies, Limits
from framework.engine.step_log import StepLog
from framework.engine.step_plan import StepPlan
from framework.engine.view_factory import make_frozen

T = TypeVar("T")
Planning = Generator[None, None, T]  # yields: bring the held tokens home (module docstring)


class Planner:
    def __init__(
        self,
        pool: BlockPool,
        policies: GuardedPolicies,
        limits: Limits,
        counters: Counters,
        held: HeldTokens,
        steps: StepLog,
        clock: Clock,
        tier: HostTier | None = None,
    ) -> None:
        self.pending: deque[Sequence] = deque()  # not yet arrived, in arrival order
        self.waiting: deque[Sequence] = deque()  # FCFS; a preempted request at the head
        self.running: list[Sequence] = []  # the next forward's rows, in admission order
        # Samples that wait in their group until they can fork from their leader; beam
        # searches and their rounds.
        self.forking = Forks(pool, counters)
        self.beams = Beams(pool, counters)
        self.pool = pool
        self.p = policies
        self.limits = limits
        self.counters = counters
        self.held = held
        self.steps = steps
        self.clock = clock  # no reference back to the engine: it is freed with its last one
        self.displaces = True  # whether the scheduler has a `displace` of its own
        self.pauses = True  # whether it has a `pause` of its own
        self.tier = tier  # the host KV tier, where a victim may swap (None: none)
        self.lookups = Lookups(pool, policies, tier)
        self._admit_counter = 0
        # Requests holding blocks outside the rows while their KV moves (`attach_parking`).
        self.parking: Parking | None = None

    def now(self) -> float:
        return self.clock.now()

    def fail(self, group: str, msg: str) -> PolicyError:
        """The error a decision that breaks the contract raises, naming the policy."""
        tag = f" ({self.p.providers[group]})" if self.p.providers.get(group) else ""
        return PolicyError(f"{group} policy {self.p.names.get(group, '?')!r}{tag}: {msg}")

    # ---- the plan --------------------------------------------------------------------
    def plan(self, timer: PhaseTimer) -> Planning[StepPlan]:
        """The step's decisions, each applied as made; the plan built once from their returns.
        Yields whenever the held tokens must come home first (the module docstring)."""
        if self.beams and any(s.num_held and self.beams.ahead(s) for s in self.running):
            yield  # a beam's next token is chosen on the host (`hand_off`) before planning
        evicted = yield from self.evict()
        if self.parking is not None and self.parking.next_landing() is not None:
            yield from self.join_landed()
        timer.lap("schedule")
        preempted = yield from self.grow()
        timer.lap("allocate")
        preempted += yield from self.displace()
        if self.beams:
            preempted += yield from self.join_beams()
        admitted, partial = self.choose()
        timer.lap("schedule")
        if admitted and self.held.count:  # the rows change: held tokens reach their requests
            yield
        cache_hits = self.admit(admitted)
        timer.lap("allocate")
        rows = (yield from self.unpaused(admitted)) if self.pauses else list(self.running)
        if self.beams:  # a beam with its token of a round waits for the others'
            rows = [s for s in rows if not self.beams.ahead(s)]
        paused = len(self.running) - len(rows)
        if paused:  # the paused rows compute nothing this step
            kept = set(map(id, rows))
            partial = {s: n for s, n in partial.items() if id(s) in kept}
        swaps = self.tier.take(bool(rows)) if self.tier is not None else NO_SWAPS
        copies = self.forking.take_copies() + tuple(self.beams.take_copies())
        return StepPlan(
            rows, partial, cache_hits, evicted, preempted, len(admitted), paused, swaps, copies
        )

    def unpaused(self, admitted: list[Sequence]) -> Planning[list[Sequence]]:
        """The running rows less those the scheduler pauses for this step (checked)."""
        paused = self.p.scheduler.pause(self.view(), admitted)
        if not paused:
            return list(self.running)
        new = set(map(id, admitted))
        running = set(map(id, self.running))
        for seq in paused:
            if id(seq) not in running or id(seq) in new:
                raise self.fail("scheduler", f"paused {seq.id}, not a running row admitted before")
        out = set(map(id, paused))
        rows = [s for s in self.running if id(s) not in out]
        if not rows:
            raise self.fail("scheduler", f"paused all {len(paused)} running rows of the step")
        if any(s.num_held for s in paused):  # the paused rows' held tokens come home first
            yield
            rows = [s for s in self.running if id(s) not in out]
        return rows

    # ---- the queues ------------------------------------------------------------------
    def enqueue(self, seq: Sequence, now: bool = False) -> None:
        """`seq` will arrive (no earlier than any enqueued before it); `now`: it waits from
        now, behind what has arrived by now (taken over from a failed replica)."""
        if not now:
            return self.pending.append(seq)
        self.arrive(self.now())
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def empty(self) -> list[Sequence]:
        """Every request leaves the queues, running rows first (a replica's failure)."""
        out = [*self.running, *self.waiting, *self.pending, *self.forking.empty()]
        for queue in (self.running, self.waiting, self.pending):
            queue.clear()
        return out

    def arrive(self, now: float) -> None:
        """Requests whose arrival time has come join the waiting queue, and, at its head,
        samples that can fork from their leader now (`Forks.ready`)."""
        pending = self.pending
        while pending and pending[0].arrival <= now:
            seq = pending.popleft()
            seq.status = Status.WAITING
            self.waiting.append(seq)
        self.release_forks()

    def hold(self, group: SampleGroup) -> None:
        """A request's samples (or beams) but the leader wait in their group to fork."""
        self.forking.hold(group)
        self.beams.add(group)

    def release_forks(self) -> None:
        """Samples that can fork from their leader now (`Forks.ready`) wait, at the head."""
        for seq in reversed(self.forking.ready() if self.forking else ()):
            seq.status = Status.WAITING
            self.waiting.appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        """`seq` leaves whichever queue holds it (an abort), its blocks still its own."""
        if self.forking.remove(seq):
            return
        if seq.status is Status.PENDING:
            self.pending.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)

    def join(self, seq: Sequence) -> None:
        """`seq` joins the running rows, the newest admitted."""
        seq.status = Status.RUNNING
        seq.admit_order = self._admit_counter
        self._admit_counter += 1
        self.running.append(seq)

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
            blocks_to_admit=self.lookups.price,
            last_step=self.steps[-1] if self.steps else None,
            rules=self.lookups,
            planned=planned,
        )

    # ---- parked requests (a cluster's hand-offs) -------------------------------------
    def hand_off(self) -> None:
        """After held tokens came home: samples that can fork now wait; rows whose part here
        is done though they owe more tokens (`HeldTokens.take_handed`) leave the rows, parked
        with their blocks held, for the cluster to move (no scheduler is asked)."""
        self.release_forks()
        if self.beams:
            self.choose_beams()
        handed = self.held.take_handed()
        if not handed:
            return
        if self.parking is None:
            raise InvariantError(f"{handed[0][0].id} handed off by an engine that parks nothing")
        now = self.now()
        for seq, forward_s in handed:
            self.running.remove(seq)
            self.parking.leave(seq, now, forward_s)

    def choose_beams(self) -> None:
        """Each beam search whose round is complete chooses its beams (`Beams.select`): a
        beam whose new hypothesis has no KV here computes it again; beams that finished
        are announced, one waiting for readmission released."""
        again, done = self.beams.select()
        for seq in again:
            self.preempt(seq)
        for seq in done:
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
                self.release(seq, Status.RELEASED, self.now())
            elif seq.status is Status.RUNNING:
                seq.status, seq.finished_at = Status.FINISHED, self.now()
            self.held.announce(seq)

    def join_beams(self) -> Planning[int]:
        """A beam that its search's other beams sit out for is admitted ahead of the
        scheduler, in a newer search's row where need be (`Beams.stalled`): else every row
        could sit out for beams no row is left for. Returns the beams preempted."""
        preempted = 0
        while (move := self.beams.stalled(self.running, self.limits.max_num_seqs)) is not None:
            seq, victims = move
            if self.held.count:  # the rows change: held tokens home first
                yield
                continue
            for victim in victims:
                self.preempt(victim)
            preempted += len(victims)
            self.lookups.forget()
            self.lookups.cached_tokens(seq)
            if self.lookups.price(seq) > self.pool.num_free:
                break  # blocks come back as others finish (or growth preempts for them)
            self.admit([seq])
        return preempted

    def join_landed(self) -> Planning[None]:
        """Landed requests join the running rows as decode rows while a row is free, ahead of
        any admission (their blocks held since the reservation, their prompt computed)."""
        now, parking, cap = self.now(), self.parking, self.limits.max_num_seqs
        assert parking is not None  # called only with landed requests

        def ready() -> bool:
            at = parking.next_landing()
            return at is not None and at <= now and len(self.running) < cap

        if not ready():
            return
        if self.held.count:  # the rows change: held tokens home first
            yield
        while ready():
            self.join(parking.land())

    # ---- evict, grow, displace -------------------------------------------------------
    def evict(self) -> Planning[int]:
        """Release the finished rows the scheduler names. Their held tokens come home first
        (the rows change), which may reveal more finished rows: the scheduler is asked again.
        It is asked only when a row has finished: with none, there is nothing it may name."""
        if not any(s.finished for s in self.running):
            return 0
        evict = self.p.scheduler.evict(self.view())
        if evict and self.held.count:
            yield
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
        when it left this replica (a preempted one has not: it waits to come back). A
        request that leaves for good drops what it swapped to the host tier."""
        if seq.host_table and status is not Status.WAITING and self.tier is not None:
            self.tier.drop(seq)
        self.counters.kv_overhang_slots -= overhang(seq, self.pool.block_size)
        self.pool.free(seq.id, seq.block_table)
        seq.block_table = []
        seq.status = status
        if at is not None:
            seq.released_at = at

    def grow(self) -> Planning[int]:
        """Give running rows the blocks this step writes into; preempt while the pool is dry.
        Held tokens are already in the cache, so a row's lookahead is its `num_held`."""
        preempted = 0
        bs = self.pool.block_size
        allocator = self.p.allocator  # guarded once around the whole loop
        grow = allocator.unguarded("blocks_to_grow")
        while True:
            try:
                # Only the rows that need blocks: most rows cross no block boundary in a step.
                need = [
                    (s, n)
                    for s in self.running
                    if not s.finished and (n := grow(s, bs, s.num_held)) > 0
                ]
            except PolicyError:
                raise
            except Exception as exc:
                raise allocator.failure("blocks_to_grow", exc) from exc
            cow = self.beams.shared_writes(self.running) if self.beams else []
            short = sum(n for _, n in need) + len(cow) - self.pool.num_free
            if short <= 0:
                break
            if self.held.count:  # the rows are about to change: every held token home first
                yield
                continue
            victims = self.p.preemption.victims(self.view(), short)
            if not victims:
                raise self.fail("preemption", f"named no victim; the pool is {short} blocks short")
            for v in victims:
                if v not in self.running or v.finished:
                    raise self.fail("preemption", f"named {v.id}, not an unfinished running row")
                self.preempt(v)
                preempted += 1
        counters = self.counters
        for seq, n in need:
            before = overhang(seq, bs)
            seq.block_table += self.pool.allocate(seq.id, n)
            counters.kv_overhang_slots += overhang(seq, self.pool.block_size) - before
        self.beams.copy_on_write(cow)  # a beam writing into a block it shares copies it
        # Whether every row got the blocks its next write needs is checked as the batch build
        # maps each written position to its slot (`BatchBuilder.short_table`).
        return preempted

    def displace(self) -> Planning[int]:
        """Preempt the running rows the scheduler displaces for a waiting request."""
        if not self.displaces:
            return 0
        victims = self.p.scheduler.displace(self.view())
        if victims and self.held.count:  # rows change: held tokens home first, ask again
            yield
            victims = self.p.scheduler.displace(self.view())
        for v in victims:
            if v not in self.running or v.finished:
                raise self.fail("scheduler", f"displaced {v.id}, not an unfinished running row")
        for v in victims:
            self.preempt(v)
        return len(victims)

    def preempt(self, seq: Sequence) -> None:
        """`seq` leaves the rows for the head of the queue, its blocks freed: its KV swapped
        to the host tier first if the preemption policy says so and the tier holds it,
        else dropped, to be computed again when it is readmitted."""
        if seq.num_held:  # growth drains before it preempts: nothing may be in flight here
            raise InvariantError(f"{seq.id} preempted with {seq.num_held} tokens in flight")
        swapped = self._swaps(seq) and self.tier is not None and self.tier.swap_out(seq)
        self.running.remove(seq)
        self.release(seq, Status.WAITING)
        seq.prefix_published = 0
        self.counters.preemptions += 1
        if not swapped:
            self.counters.recomputed_tokens += seq.num_computed
            seq.num_computed = 0
        seq.preemptions += 1
        self.beams.preempted(seq)  # a beam's token not chosen from yet is computed again
        self.waiting.appendleft(seq)

    def _swaps(self, seq: Sequence) -> bool:
        mode: object = self.p.preemption.mode(self.view(), seq)
        if mode not in PREEMPTION_MODES or (mode == SWAP and self.tier is None):
            have = "a host KV tier" if self.tier else "no host KV tier (engine.host_kv_memory_mb)"
            raise self.fail("preemption", f"mode {mode!r} for {seq.id}, with {have}")
        return mode == SWAP and seq.group not in self.beams.searches  # beams recompute

    # ---- admissions ------------------------------------------------------------------
    def choose(self) -> tuple[list[Sequence], dict[Sequence, int]]:
        """The scheduler's admissions, checked against every budget, and the rows that
        compute fewer than all their pending tokens (with how many)."""
        lookups = self.lookups
        lookups.forget()  # a lookup holds for the planning it was made in
        partial, tokens = self._plan_running()
        view = self.view(planned=tokens)
        admit = self.p.scheduler.admit(view)
        rows = len(self.running)
        blocks = 0
        prices: list[int] = []
        chosen: set[int] = set()  # by status, not by a scan: the queue may hold thousands
        for seq in admit:
            if seq.status is not Status.WAITING or id(seq) in chosen:
                raise self.fail("scheduler", f"admitted {seq.id}, which is not waiting")
            chosen.add(id(seq))
            rows += 1
            lookups.cached_tokens(seq)  # charged what it does not find cached (as it is now)
            n = self._chunk(view, seq, self.limits.max_num_batched_tokens - tokens)
            if n != seq.step_tokens:
                partial[seq] = n
            tokens += n
            if not self.p.allocator.admits(view, seq, self.pool.num_free - blocks):
                raise self.fail("scheduler", f"admitted {seq.id}, which the allocator declines")
            prices.append(lookups.price(seq))
            blocks += prices[-1]
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
        if blocks > (free := self.pool.num_free):
            raise self.fail("scheduler", f"admissions need {blocks} blocks, {free} are free")
        if self.pool.layout != "paged" and not self.pool.can_place(prices):
            raise self.fail(
                "scheduler",
                f"admissions need extents of {prices} blocks, which the pool's free space "
                "(in pieces) cannot place",
            )
        return admit, partial

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
        prefilling = [
            s for s in self.running if s.num_computed < s.prefill_end - 1 and s.step_tokens > 1
        ]
        tokens = len(self.running)
        partial: dict[Sequence, int] = {}
        if not prefilling:
            return partial, tokens
        view = self.view()
        for seq in prefilling:
            # One token of each row is already counted; the row may take the rest left.
            n = self._chunk(view, seq, self.limits.max_num_batched_tokens - tokens + 1)
            tokens += n - 1
            if n != seq.step_tokens:
                partial[seq] = n
        return partial, tokens

    def admit(self, admit: list[Sequence]) -> dict[Sequence, int]:
        """The chosen requests join the running rows, with their blocks; returns the cached
        tokens each found (a prefix cache's), which its forward reads and does not compute."""
        cache_hits: dict[Sequence, int] = {}
        # Every admission's shared blocks are taken before any fresh block is handed out (a
        # fresh one may evict a cached block a later admission was charged as cached), each
        # exactly those it was charged for (one published since would change its chunk).
        bs = self.pool.block_size
        sources = {seq: src for seq in admit if (src := self.lookups.fork_source(seq))}
        hits = [self.lookups.taken(seq, sources.get(seq)) for seq in admit]
        for seq, held in zip(admit, hits, strict=True):
            (self.pool.fork if seq in sources else self.pool.share)(seq.id, held)
        for seq, held in zip(admit, hits, strict=True):
            self.waiting.remove(seq)
            n = self.p.allocator.blocks_to_admit(seq, bs)
            seq.block_table = held + self.pool.allocate(seq.id, max(0, n - len(held)))
            self.counters.kv_overhang_slots += overhang(seq, self.pool.block_size)
            seq.cached_prefix = 0
            if (source := sources.get(seq)) is not None:  # its prompt is no cache lookup
                cache_hits[seq] = self.forking.fork(seq, source, len(held))
            else:
                if held:  # its forward starts after the cached blocks, reading them
                    seq.num_computed = cache_hits[seq] = len(held) * bs
                seq.prefix_published = len(held)
                self.pool.count_admission(seq, self.counters)
            if max(n, len(seq.block_table)) * bs < (need := seq.num_tokens):
                raise self.fail("allocator", f"gave {seq.id} {n} blocks for {need} tokens")
            if seq.host_table and self.tier is not None:  # swapped out: its KV comes back
                self.tier.swap_in(seq)
            else:
                seq.prefill_end = seq.total_len  # all of it is prefill, until the row samples
            if seq.admitted_at is None:
                seq.admitted_at = self.now()
            self.join(seq)
        return cache_hits
