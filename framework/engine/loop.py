"""The engine: one step at a time, policies decide and the engine applies.

    arrivals -> evict -> grow (preempt if dry) -> admit -> build -> forward+sample
             -> output (drain held tokens?) -> apply -> observe

Every mutation of sequences and blocks happens here, after the engine has validated the
policy's decision, so the invariants live in one place.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from framework.api.guard import Guarded
from framework.api.policy import (
    Allocator,
    EngineView,
    OutputPolicy,
    OutputView,
    PolicyError,
    Preemption,
    QueueView,
    Scheduler,
)
from framework.engine.batch import HELD, Row, StepBatch
from framework.engine.block_pool import BlockPool
from framework.engine.clock import Clock, WallClock
from framework.engine.costs import CostModel
from framework.engine.counters import Counters, StepStats
from framework.engine.executor import Executor
from framework.engine.frozen import make_frozen
from framework.engine.heap import frozen_heap
from framework.engine.invariants import InvariantError, check_end, check_step
from framework.engine.prefix_cache import PrefixCachingPool
from framework.engine.readback import Pending, Readback
from framework.engine.request import RequestSpec
from framework.engine.sequence import Sequence, Status


@dataclass
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"engine.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"engine.max_num_seqs ({self.max_num_seqs}): every row costs at least one token"
            )


@dataclass
class Policies:
    scheduler: Scheduler
    allocator: Allocator
    preemption: Preemption
    output: OutputPolicy
    names: dict[str, str]  # group -> registered name, for error messages
    providers: dict[str, str] = field(default_factory=dict)  # group -> plugin distribution


@dataclass
class RunResult:
    """What the engine counted in a run; `framework.run.summary.summarize` makes it the
    flat summary of `metrics.json`."""

    seqs: list[Sequence]
    steps: list[StepStats]
    counters: Counters
    max_num_seqs: int
    peak_blocks: int
    num_blocks: int
    clock: str = "wall"  # which clock the times are on: "wall" or "virtual"
    executor: dict[str, str] = field(default_factory=dict)  # what produced the steps


def describe(executor: Any) -> dict[str, str]:
    """What an executor says of itself (`describe()`: its name, and for a simulator what its
    costs come from), for metrics.json; an executor that says nothing is named by its class."""
    said = getattr(executor, "describe", None)
    return dict(said()) if callable(said) else {"executor": type(executor).__name__}


def _any_finished(running: list[Sequence]) -> bool:
    """Whether a running row is `finished` (inlined; a plain loop is 1.7x `any()` over a
    generator, 7 against 12 µs at 126 rows)."""
    for s in running:
        if s.finish_reason is not None or len(s.output_token_ids) + s.num_held >= s._max_tokens:
            return True
    return False


def displaces(scheduler: Any) -> bool:
    """Whether the scheduler has a `displace` of its own. One that keeps `Scheduler.displace`
    (it names no one) is not asked: a view a step fewer, and at trace scale a view is a
    tenth of a small step's work."""
    try:
        if isinstance(scheduler, Guarded):
            own = scheduler.unguarded("displace")
        else:
            own = scheduler.displace
    except AttributeError:  # not a `Scheduler`: asked, and fails, as it would have
        return True
    return getattr(own, "__func__", None) is not Scheduler.displace


@dataclass
class _Held:
    """Sampled tokens of one step still on the device, and the rows that produced them."""

    rows: list[Sequence]
    discard: list[bool]
    pending: Pending
    window: float  # the output policy's window when these were sampled
    # When these tokens exist on the device, on a virtual clock whose device runs apart
    # from the host (`VirtualClock.overlap`); unread otherwise.
    ready_at: float = 0.0

    @property
    def kept_rows(self) -> int:
        return len(self.discard) - sum(self.discard)


class Engine:
    def __init__(
        self,
        executor: Executor,
        pool: BlockPool,
        scratch_block: int,
        policies: Policies,
        limits: Limits,
        hooks: Any,
        check_invariants: bool = True,
        device: torch.device | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.executor = executor
        self._map_slots = True  # read from the executor when a run starts (`run`)
        # A readback's seconds as the executor predicts them (a simulator: it does none);
        # None: timed as it happens. Read when a run starts; summed per step for its phases.
        self._readback_s: float | None = None
        self._step_readback_s = 0.0
        self._step_wait_s = 0.0  # the host waiting for a simulated device (`phase_s["wait"]`)
        self.pool = pool
        self.scratch_block = scratch_block
        self.p = policies
        for group in ("scheduler", "allocator", "preemption", "output"):
            name = policies.names.get(group, "?")
            guarded = Guarded(getattr(policies, group), group, name, policies.providers.get(group))
            setattr(self.p, group, guarded)
        self._displaces = True  # read from the scheduler when a run starts (`run`)
        self.limits = limits
        self.hooks = hooks
        self.check_invariants = check_invariants
        self.pending: deque[Sequence] = deque()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: list[Sequence] = []
        self.steps: list[StepStats] = []
        self.counters = Counters()
        self.held: list[_Held] = []
        self.readback = Readback(device or torch.device("cpu"))
        self.costs = CostModel()
        self._admit_counter = 0
        self.clock = clock or WallClock()
        # This step's chunk of each row that does not compute all it has pending (chunked
        # prefill, `Scheduler.chunk`); set when admissions are chosen, read by `_build`.
        self._chunks: dict[Sequence, int] = {}
        # Prefix caching: the pool shares published blocks (`allocator=prefix_cache`).
        self.cache = pool if isinstance(pool, PrefixCachingPool) else None
        # Waiting requests whose `cached_prefix` was looked up: cleared at the next
        # admission, so a hint never outlives the step it was taken in (the blocks it
        # counted may be evicted since, and a scheduler may read `step_tokens` directly).
        self._hinted: list[Sequence] = []

    # ---- run -------------------------------------------------------------------------
    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> RunResult:
        # A prompt's cache slots are a list as long as the prompt; an executor that reads the
        # rows' shapes only (the simulator) says so, and the engine skips mapping them.
        self._map_slots = getattr(self.executor, "reads_slots", True)
        self._readback_s = getattr(self.executor, "readback_s", None)
        self._displaces = displaces(self.p.scheduler)
        # The workload, the model and, once made, the sequences live until the run ends:
        # kept out of the garbage collector's full passes meanwhile (`frozen_heap`).
        with frozen_heap() as freeze:
            self.seqs = [Sequence(spec, eos_token_id) for spec in specs]
            ids = [s.id for s in self.seqs]
            if len(set(ids)) != len(ids):
                raise ValueError("workload request ids must be unique")
            for seq in sorted(self.seqs, key=lambda s: s.arrival):
                reason = self._why_never(seq)
                if reason:
                    seq.status, seq.reject_reason = Status.REJECTED, reason
                else:
                    self.pending.append(seq)
            freeze()
            self.clock.start()
            while self.pending or self.waiting or self.running:
                if not self.waiting and not self.running:
                    self.clock.wait_until(self.pending[0].arrival)
                self.step()
        result = self.partial_result()
        if self.check_invariants:
            check_end(self.seqs, self.pool, self.counters, self.held)
        return result

    def partial_result(self) -> RunResult:
        """What has been measured so far: the whole result after `run`, or, after a run
        stopped by an error or Ctrl-C, the part worth writing down (marked incomplete by the
        caller)."""
        return RunResult(
            self.seqs,
            self.steps,
            self.counters,
            self.limits.max_num_seqs,
            self.pool.peak_used,
            self.pool.num_blocks,
            clock=self.clock.name,
            executor=describe(self.executor),
        )

    @property
    def chunks_prefill(self) -> bool:
        """The scheduler may cut prefills (`Scheduler.chunks_prefill`): then a request
        longer than the token budget is served in chunks, not rejected."""
        return bool(getattr(self.p.scheduler, "chunks_prefill", False))

    def now(self) -> float:
        return self.clock.now()

    def _why_never(self, seq: Sequence) -> str | None:
        """A request that no schedule can ever serve is rejected up front, with the reason."""
        if seq.max_len > self.limits.max_model_len:
            return (
                f"prompt + max_tokens = {seq.max_len} exceeds the model's context "
                f"({self.limits.max_model_len})"
            )
        need = self.pool.blocks_for(seq.max_len)
        if need > self.pool.num_blocks:
            return (
                f"prompt + max_tokens = {seq.max_len} needs {need} blocks; the pool has "
                f"{self.pool.num_blocks} (engine.num_blocks)"
            )
        if seq.max_len > self.limits.max_num_batched_tokens and not self.chunks_prefill:
            return (
                f"prompt + max_tokens = {seq.max_len} exceeds engine.max_num_batched_tokens "
                f"= {self.limits.max_num_batched_tokens} (a preempted request is prefilled "
                f"again whole)"
            )
        return None

    # ---- one step --------------------------------------------------------------------
    def step(self) -> StepStats | None:
        # The host phases' seconds, from stamps taken between them (a stamp is a tenth of
        # the dict update a timing closure did eight times a step).
        perf = time.perf_counter
        t0 = perf()
        self._step_readback_s = self._step_wait_s = 0.0
        now = self.now()
        while self.pending and self.pending[0].arrival <= now:
            seq = self.pending.popleft()
            seq.status = Status.WAITING
            self.waiting.append(seq)

        transfers_before = self.counters.transfers
        kept_early, finished = 0, []
        evicted, k, f = self._evict()
        kept_early += k
        finished += f
        t1 = perf()
        preempted, k, f = self._grow()
        kept_early += k
        finished += f
        t2 = perf()
        displaced, k, f = self._displace()
        preempted += displaced
        kept_early += k
        finished += f
        admitted = self._choose_admissions()
        t3 = perf()
        k, f = self._admit(admitted)
        kept_early += k
        finished += f
        t4 = perf()
        if not self.running:
            self._notify(finished)
            if self.waiting and not self.pending:
                raise self._fail(
                    "scheduler",
                    f"admitted nothing while the engine is idle and {len(self.waiting)} "
                    "requests wait",
                )
            return None

        batch = self._build()
        t5 = perf()
        self.clock.executing(len(batch.rows))
        result = self.executor.execute(batch)
        ready_at, waited = self.clock.executed(result.prepare_s, result.forward_s + result.sample_s)
        self._step_wait_s += waited  # a simulated GPU still busy with the step before
        phase: dict[str, float] = {
            "schedule": (t1 - t0) + (t3 - t2),
            "allocate": (t2 - t1) + (t4 - t3),
            # the executor's tensor preparation is host work, even though the executor does it
            "build": (t5 - t4) + result.prepare_s,
            "forward": result.forward_s,
            "sample": result.sample_s,
        }
        t6 = perf()
        if batch.decode_rows == len(batch.rows):
            self.costs.observe_forward(len(batch.rows), result.forward_s)
        wasted = 0
        unkept: list[bool] = []  # rows whose token nobody keeps
        for row_seq, row in zip(self.running, batch.rows, strict=True):
            if row.discard:
                wasted += 1
                unkept.append(True)
            else:
                row_seq.num_computed = row.ctx_len  # start_pos + its tokens
                if row.samples:  # a chunk short of the end samples nothing
                    row_seq.num_held += 1
                unkept.append(not row.samples)
        if self.cache is not None:
            self._publish()
        self.counters.token_slots += batch.sampling_rows
        self.counters.prefill_tokens += batch.prefill_tokens
        self.counters.prefill_chunks += len(batch.rows) - batch.decode_rows
        held = _Held(
            list(self.running),
            unkept,
            self.readback.start(result.tokens),
            self.p.output.window(),
            ready_at,
        )
        self.held.append(held)
        self.counters.deferred_tokens += held.kept_rows
        self.counters.held_tokens += held.kept_rows

        keep = self.p.output.keep(self._output_view())
        if not 0 <= keep <= len(self.held):
            raise self._fail("output", f"asked to keep {keep} of {len(self.held)} held steps")
        drained = self._drain(len(self.held) - keep)
        t7 = perf()
        k, f = self._apply(drained)
        kept = kept_early + k
        finished += f
        t8 = perf()
        phase["output"] = t7 - t6
        phase["apply"] = t8 - t7
        self._notify(finished)
        window = self.p.output.window()  # after `keep`, which may have moved it
        stats = StepStats(
            step=len(self.steps),
            time=self.now(),
            rows=len(batch.rows),
            prefill_rows=len(batch.rows) - batch.decode_rows,
            prefill_tokens=batch.prefill_tokens,
            decode_rows=batch.decode_rows,
            decode_tokens=batch.decode_rows,
            partial_rows=len(batch.rows) - batch.sampling_rows,
            wasted_rows=wasted,
            tokens_kept=kept,
            admitted=len(admitted),
            evicted=len(evicted),
            preempted=preempted,
            waiting=len(self.waiting),
            blocks_in_use=self.pool.num_used,
            transfers=self.counters.transfers - transfers_before,
            held_steps=len(self.held),
            window=window,
            phase_s=phase,
        )
        if self.check_invariants:
            check_step(
                batch,
                running=self.running,
                pool=self.pool,
                counters=self.counters,
                held_steps=len(self.held),
                window=window,
                output_name=self.p.names.get("output", "?"),
                max_num_seqs=self.limits.max_num_seqs,
                max_num_batched_tokens=self.limits.max_num_batched_tokens,
            )
        self.hooks.on_step_end(stats=stats)
        phase["hooks"] = perf() - t8
        if self._step_readback_s:  # predicted, so apart from the host phases timed around it
            phase["readback"] = self._step_readback_s
        if self._step_wait_s:
            phase["wait"] = self._step_wait_s
        self.clock.account(phase, len(batch.rows))
        self.steps.append(stats)
        return stats

    def _notify(self, finished: list[Sequence]) -> None:
        for seq in finished:
            self.hooks.on_request_finished(request=seq)

    def _view(self, planned_tokens: int | None = None) -> EngineView:
        sched, allocator = self.p.scheduler, self.p.allocator
        # The view's own rules reach it through a weak reference: a closure holding the view
        # it belongs to is a reference cycle, left for the garbage collector (several views
        # a step, each with a copy of the running rows: at trace scale the collector's work).
        this: Callable[[], EngineView | None]

        def chunk_rule(seq: Sequence, budget: int) -> int:
            return sched.chunk(this(), seq, budget)

        def admits(seq: Sequence, free: int) -> bool:
            return allocator.admits(this(), seq, free)

        view = make_frozen(
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
            blocks_to_admit=self._price,
            last_step=self.steps[-1] if self.steps else None,
            chunk_rule=chunk_rule,
            planned_tokens=planned_tokens,
            cached=None if self.cache is None else self._cached_tokens,
            admits=admits,
        )
        this = weakref.ref(view)
        return view

    def _output_view(self) -> OutputView:
        return make_frozen(
            OutputView,
            step=len(self.steps),
            held_steps=len(self.held),
            running=tuple(self.running),
            transfer_s=self.costs.transfer_s,
            row_s=self.costs.row_s,
        )

    def _fail(self, group: str, msg: str) -> PolicyError:
        who = self.p.providers.get(group)
        tag = f" ({who})" if who else ""
        return PolicyError(f"{group} policy {self.p.names.get(group, '?')!r}{tag}: {msg}")

    # ---- schedule & allocate -----------------------------------------------------------
    def _evict(self) -> tuple[list[Sequence], int, list[Sequence]]:
        """Release the finished rows the scheduler names. Their held tokens come home first
        (the rows change), which may reveal more finished rows: the scheduler is asked again."""
        kept, finished = 0, []
        # A scheduler may name finished running rows only (checked below), so it is asked
        # only when there is one: at trace scale a row finishes in one step of fifty, and the
        # view and the call were a tenth of an idle step's work.
        if not _any_finished(self.running):
            return [], kept, finished
        evict = self.p.scheduler.evict(self._view())
        if evict and self.held:
            kept, finished = self._apply(self._drain(len(self.held)))
            evict = self.p.scheduler.evict(self._view())
        for seq in evict:
            if seq not in self.running or not seq.finished:
                raise self._fail("scheduler", f"evicted {seq.id}, not a finished running row")
        for seq in evict:
            self.running.remove(seq)
            self.pool.free(seq.id, seq.block_table)
            seq.block_table = []
            seq.status = Status.RELEASED
            seq.released_at = self.now()
        return evict, kept, finished

    def _grow(self) -> tuple[int, int, list[Sequence]]:
        """Give running rows the blocks this step writes into; preempt while the pool is dry.

        Held tokens are already in the cache, so a row's lookahead is its `num_held`.
        """
        preempted, kept, finished = 0, 0, []
        bs = self.pool.block_size
        allocator = self.p.allocator
        guarded = isinstance(allocator, Guarded)  # guarded once around the whole loop
        grow = allocator.unguarded("blocks_to_grow") if guarded else allocator.blocks_to_grow
        while True:
            try:
                # Only the rows that need blocks: at trace scale most rows cross no block
                # boundary in a step, so the list stays short.
                need = [
                    (s, n)
                    for s in self.running
                    if s.finish_reason is None  # `not s.finished`, inlined (every row, step)
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
            if self.held:  # the rows are about to change: bring every held token home first
                k, f = self._apply(self._drain(len(self.held)))
                kept, finished = kept + k, finished + f
                continue
            victims = self.p.preemption.victims(self._view(), short)
            if not victims:
                raise self._fail("preemption", f"named no victim; the pool is {short} blocks short")
            for v in victims:
                if v not in self.running or v.finished:
                    raise self._fail("preemption", f"named {v.id}, not an unfinished running row")
                self._preempt(v)
                preempted += 1
        for seq, n in need:
            seq.block_table += self.pool.allocate(seq.id, n)
        # Whether every row got the blocks its next write needs is checked as `_build` maps
        # each written position to its slot (`_short_table`): free, rather than a pass over
        # the rows of every step.
        return preempted, kept, finished

    def _short_table(self, seq: Sequence, exc: IndexError) -> Exception:
        """What an IndexError while building `seq`'s row means: the allocator left it too
        few blocks for the positions this step writes (the original error, if not)."""
        bs = self.pool.block_size
        if len(seq.block_table) * bs >= seq.total_len:
            return exc
        return self._fail(
            "allocator",
            f"left {seq.id} {len(seq.block_table)} blocks for {seq.total_len} cached tokens "
            f"({seq.num_held} held on the device)",
        )

    def _displace(self) -> tuple[int, int, list[Sequence]]:
        """Preempt the running rows the scheduler displaces for a waiting request."""
        kept, finished = 0, []
        if not self._displaces:
            return 0, kept, finished
        victims = self.p.scheduler.displace(self._view())
        if victims and self.held:  # rows change: held tokens home first, then ask again
            kept, finished = self._apply(self._drain(len(self.held)))
            victims = self.p.scheduler.displace(self._view())
        for v in victims:
            if v not in self.running or v.finished:
                raise self._fail("scheduler", f"displaced {v.id}, not an unfinished running row")
        for v in victims:
            self._preempt(v)
        return len(victims), kept, finished

    def _preempt(self, seq: Sequence) -> None:
        if seq.num_held:  # _grow drains before it preempts: nothing may be in flight here
            raise InvariantError(f"{seq.id} preempted with {seq.num_held} tokens in flight")
        self.running.remove(seq)
        self.pool.free(seq.id, seq.block_table)
        seq.block_table = []
        seq.prefix_published = 0
        self.counters.preemptions += 1
        self.counters.recomputed_tokens += seq.num_computed
        seq.num_computed = 0
        seq.preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def _choose_admissions(self) -> list[Sequence]:
        for seq in self._hinted:
            if seq.status is Status.WAITING:
                seq.cached_prefix = 0
        self._hinted.clear()
        chunks, tokens = self._plan_running()
        view = self._view(planned_tokens=tokens)
        admit = self.p.scheduler.admit(view)
        rows = len(self.running)
        blocks = 0
        chosen: set[int] = set()  # by status, not by a scan: the queue may hold thousands
        for seq in admit:
            if seq.status is not Status.WAITING or id(seq) in chosen:
                raise self._fail("scheduler", f"admitted {seq.id}, which is not waiting")
            chosen.add(id(seq))
            rows += 1
            if self.cache is not None:  # charged what it does not find cached (as it is now)
                self._cached_tokens(seq)
            n = self._chunk(view, seq, self.limits.max_num_batched_tokens - tokens)
            if n != seq.step_tokens:
                chunks[seq] = n
            tokens += n
            if not self.p.allocator.admits(view, seq, self.pool.num_free - blocks):
                raise self._fail("scheduler", f"admitted {seq.id}, which the allocator declines")
            blocks += self._price(seq)
        lim = self.limits
        if rows > lim.max_num_seqs:
            raise self._fail(
                "scheduler",
                f"batch of {rows} rows exceeds engine.max_num_seqs = {lim.max_num_seqs}",
            )
        if tokens > lim.max_num_batched_tokens:
            raise self._fail(
                "scheduler",
                f"step of {tokens} tokens exceeds engine.max_num_batched_tokens = "
                f"{lim.max_num_batched_tokens}",
            )
        if blocks > self.pool.num_free:
            raise self._fail(
                "scheduler", f"admissions need {blocks} blocks, {self.pool.num_free} are free"
            )
        self._chunks = chunks
        return admit

    def _hits(self, seq: Sequence) -> list[int]:
        """The cached blocks holding `seq`'s leading full blocks (none without a prefix
        cache). At most (tokens - 1) // block_size: the last token is always computed, so
        the row samples from its own forward and never writes into a shared block."""
        if self.cache is None:
            return []
        bs = self.pool.block_size
        return self.cache.match(seq.tokens_from(0), (seq.num_tokens - 1) // bs)

    def _cached_tokens(self, seq: Sequence) -> int:
        """`seq`'s leading tokens in the prefix cache now; a waiting request's forward would
        skip them, so its `step_tokens` leaves them out from here until its admission."""
        n = len(self._hits(seq)) * self.pool.block_size
        if seq.status is Status.WAITING:
            seq.cached_prefix = n
            self._hinted.append(seq)
        return n

    def _price(self, seq: Sequence) -> int:
        """Free blocks admitting `seq` takes: the allocator's price, less the cached blocks
        it shares that another table holds already (those cost nothing; an evictable cached
        block costs one, like a fresh one)."""
        n = self.p.allocator.blocks_to_admit(seq, self.pool.block_size)
        if self.cache is None:
            return n
        return n - self.cache.in_use(self._hits(seq))

    def _publish(self) -> None:
        """Full blocks whose K/V this step wrote, and whose tokens the host knows (not the
        held ones), become reusable: published under their chained hash."""
        assert self.cache is not None
        bs = self.pool.block_size
        for seq in self.running:
            known = min(seq.num_computed, seq.num_tokens)
            if known // bs > seq.prefix_published:
                seq.prefix_published = self.cache.publish(
                    seq.id, seq.block_table, seq.tokens_between(0, known), seq.prefix_published
                )
        self.counters.prefix_evictions = self.cache.evictions

    def _chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        """The scheduler's chunk of `seq`'s pending tokens, checked."""
        n = self.p.scheduler.chunk(view, seq, budget)
        if not isinstance(n, int) or not 1 <= n <= seq.step_tokens:
            raise self._fail(
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
        # `s.step_tokens > 1`, inlined (every row, every step): a row not yet sampling
        # with more than one token pending.
        partial = [
            s for s in self.running if s.num_computed < s.prefill_end - 1 and s.step_tokens > 1
        ]
        tokens = len(self.running)
        chunks: dict[Sequence, int] = {}
        if not partial:
            return chunks, tokens
        view = self._view()
        for seq in partial:
            # One token of each row is already counted; the row may take the rest left.
            n = self._chunk(view, seq, self.limits.max_num_batched_tokens - tokens + 1)
            tokens += n - 1
            if n != seq.step_tokens:
                chunks[seq] = n
        return chunks, tokens

    def _admit(self, admit: list[Sequence]) -> tuple[int, list[Sequence]]:
        kept, finished = 0, []
        if admit and self.held:  # the rows change: held tokens must reach their requests first
            kept, finished = self._apply(self._drain(len(self.held)))
        # Every admission's cached blocks are taken before any fresh block is handed out:
        # a fresh allocation may evict a cached block nobody holds, and one that a later
        # admission of this step was charged as cached must still be there for it.
        # Each takes exactly the cached blocks it was charged for (a block published since
        # would change the chunk the scheduler chose).
        bs = self.pool.block_size
        hits = [self._hits(seq)[: seq.cached_prefix // bs] for seq in admit]
        if self.cache is not None:
            for seq, held in zip(admit, hits, strict=True):
                if len(held) * bs != seq.cached_prefix:
                    raise RuntimeError(
                        f"engine: {seq.id} was charged for {seq.cached_prefix} cached tokens "
                        f"and finds {len(held) * bs}"
                    )
                self.cache.share(seq.id, held)
        for seq, held in zip(admit, hits, strict=True):
            self.waiting.remove(seq)
            n = self.p.allocator.blocks_to_admit(seq, self.pool.block_size)
            seq.block_table = held + self.pool.allocate(seq.id, max(0, n - len(held)))
            seq.cached_prefix = 0
            if held:  # its forward starts after the cached blocks, reading them
                seq.num_computed = len(held) * self.pool.block_size
            seq.prefix_published = len(held)
            if self.cache is not None:
                cached = seq.num_computed
                if seq.preemptions:
                    self.counters.prefix_recompute_hit_tokens += cached
                else:
                    self.counters.prefix_query_tokens += seq.prompt_len
                    self.counters.prefix_hit_tokens += cached
            if max(n, len(seq.block_table)) * self.pool.block_size < seq.num_tokens:
                raise self._fail(
                    "allocator", f"gave {seq.id} {n} blocks for {seq.num_tokens} tokens"
                )
            seq.status = Status.RUNNING
            seq.prefill_end = seq.total_len  # all of it is prefill, until the row samples
            seq.admit_order = self._admit_counter
            self._admit_counter += 1
            if seq.admitted_at is None:
                seq.admitted_at = self.now()
            self.running.append(seq)
        return kept, finished

    # ---- build -----------------------------------------------------------------------
    def _slots(self, table: list[int], start: int, end: int) -> list[int]:
        """The cache slots of positions start..end-1: one contiguous range per block, so a
        thousand-token prompt costs a few list extensions, not a thousand lookups."""
        bs = self.pool.block_size
        if end - start == 1:
            return [table[start // bs] * bs + start % bs]
        if end - start > 4 * bs:  # a long prompt: one numpy outer sum, not a loop per block
            first, last = start // bs, (end - 1) // bs + 1
            if last > len(table):
                raise IndexError(f"block {last - 1} of a {len(table)}-block table")
            grid = np.asarray(table[first:last])[:, None] * bs + np.arange(bs)
            off = start - first * bs
            return grid.ravel()[off : off + end - start].tolist()
        slots: list[int] = []
        pos = start
        while pos < end:
            base = table[pos // bs] * bs
            stop = min(end, (pos // bs + 1) * bs)
            slots.extend(range(base + pos % bs, base + pos % bs + (stop - pos)))
            pos = stop
        return slots

    def _build(self) -> StepBatch:
        """One packed batch. While the rows are exactly those of the newest held step, every
        row with a held token takes it from that step's device tensor: nothing crosses to the
        host (a row part way through a chunked prefill sends its next prompt tokens)."""
        bs = self.pool.block_size
        newest = self.held[-1] if self.held else None
        from_device = newest is not None and newest.rows == self.running
        chunks = self._chunks
        map_slots = self._map_slots
        rows: list[Row] = []
        num_tokens = prefill_tokens = decode_rows = sampling_rows = 0
        try:
            for i, seq in enumerate(self.running):
                # `finished`, `total_len` and `id` inlined: this loop runs for every row of every
                # step, and at trace scale it is the largest share of the engine's host work.
                spec = seq.spec
                sampling = spec.sampling
                out = seq.output_token_ids
                index = len(out) + seq.num_held
                total_len = seq._prompt_len + index
                if seq.finish_reason is not None or index >= seq._max_tokens:
                    # Still in a static batch: computed like a decode row over its cached context,
                    # kept by nobody. Its K/V goes to the scratch block: no live block is touched.
                    token = HELD if from_device else seq.tokens_from(seq.num_tokens - 1)[0]
                    scratch = [self.scratch_block * bs + i % bs]
                    rows.append(
                        Row(
                            seq.id,
                            [token],
                            seq.num_computed,
                            scratch,
                            seq.block_table,
                            seq.num_computed,
                            seq.sampling,
                            index,
                            discard=True,
                            prefill=False,
                        )
                    )
                    num_tokens += 1
                    decode_rows += 1
                    sampling_rows += 1
                    continue
                start = seq.num_computed
                table = seq.block_table
                if seq.num_held:
                    if not from_device:
                        raise InvariantError(f"{seq.id}'s input token is held but its rows changed")
                    tokens = [HELD]
                    slots = [table[start // bs] * bs + start % bs]
                elif start == total_len - 1:
                    # A decode row (most rows of most steps): its one input token is the last
                    # applied one; no slicing, no slot loop.
                    tokens = [out[-1]] if out else [spec.prompt_token_ids[-1]]
                    slots = [table[start // bs] * bs + start % bs]
                else:
                    n = chunks.get(seq)  # None: all it has pending
                    if n is None:
                        tokens = seq.tokens_from(start)
                    else:
                        tokens = seq.tokens_between(start, start + n)
                    end = start + len(tokens)
                    if map_slots:
                        slots = self._slots(table, start, end)
                    elif (end - 1) // bs >= len(table):  # the check `_slots` makes, alone
                        raise IndexError(f"block {(end - 1) // bs} of a {len(table)}-block table")
                    else:
                        slots = []  # an executor that reads shapes only: nothing to map
                q = len(tokens)
                end = start + q
                samples = end == total_len
                prefill = start < seq.prefill_end
                rows.append(
                    Row(
                        spec.id,
                        tokens,
                        start,
                        slots,
                        table,
                        end,
                        sampling,
                        index,
                        False,
                        samples,
                        prefill,
                    )
                )
                num_tokens += q
                if prefill:
                    prefill_tokens += q
                else:
                    decode_rows += 1
                sampling_rows += samples
        except IndexError as exc:  # a block table too short for a position this step writes
            raise self._short_table(self.running[len(rows)], exc) from exc
        device_inputs = newest.pending.tokens if from_device and newest is not None else None
        return StepBatch.counted(
            rows,
            device_inputs,
            num_tokens=num_tokens,
            prefill_tokens=prefill_tokens,
            decode_rows=decode_rows,
            sampling_rows=sampling_rows,
        )

    # ---- output & apply --------------------------------------------------------------
    def _drain(self, n: int) -> list[tuple[_Held, list[int]]]:
        """The `n` oldest held steps home in one concatenation and one transfer: each step
        with its rows' values. Always handed to `_apply`, which gives the tokens to their
        requests."""
        if n <= 0 or not self.held:
            return []
        out_steps, self.held = self.held[:n], self.held[n:]
        t = time.perf_counter()
        values = self.readback.fetch([h.pending for h in out_steps])
        if self._readback_s is None:
            self.costs.observe_transfer(time.perf_counter() - t)
        else:  # a simulator prices the readback it does not do, on its clock
            waited, copy = self.clock.fetched(out_steps[-1].ready_at, self._readback_s)
            self.costs.observe_transfer(waited + copy)  # what a real drain's timer reads
            self._step_readback_s += copy
            self._step_wait_s += waited
        self.counters.transfers += 1
        rows = sum(len(h.rows) for h in out_steps) if len(out_steps) > 1 else len(out_steps[0].rows)
        if len(values) != rows:
            raise InvariantError(f"readback brought {len(values)} tokens for {rows} rows")
        if len(out_steps) == 1:  # immediate output: every step, one held step
            return [(out_steps[0], values)]
        drained: list[tuple[_Held, list[int]]] = []
        i = 0
        for h in out_steps:
            j = i + len(h.rows)
            drained.append((h, values[i:j]))
            i = j
        return drained

    def _apply(self, drained: list[tuple[_Held, list[int]]]) -> tuple[int, list[Sequence]]:
        """Tokens reach their requests; stop and length checks; finish times stamped.

        A token for a request whose stop token already arrived is overshoot: computed because
        the window kept the host from seeing the stop in time. One pass a held step, row by
        row (no tuple a row: at trace scale this runs for every row of every step).
        """
        now = self.now()
        kept = 0
        finished: list[Sequence] = []
        counters = self.counters
        for h, values in drained:
            window = h.window
            counters.held_tokens -= h.kept_rows
            for seq, discard, token in zip(h.rows, h.discard, values, strict=True):
                if discard:
                    continue
                seq.num_held -= 1
                if seq.finish_reason is not None:
                    counters.overshoot_tokens += 1
                    continue
                out = seq.output_token_ids
                out.append(token)
                seq.token_times.append(now)
                if seq.first_token_at is None:
                    seq.first_token_at = now
                kept += 1
                if token in seq._stop_ids:  # `seq.stop_ids()`, inlined (every token)
                    seq.finish_reason = "stop"
                    if window >= 1:
                        counters.expected_overshoot += (window + 1) / 2
                elif len(out) >= seq._max_tokens:
                    seq.finish_reason = "length"
                if seq.finish_reason:
                    seq.status = Status.FINISHED
                    seq.finished_at = now
                    finished.append(seq)
        self.counters.tokens_kept += kept
        return kept, finished
