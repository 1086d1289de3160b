"""The engine: one step at a time, policies decide and the engine applies.

    step = arrive -> plan (evict, grow, displace, choose, admit) -> build(plan) -> execute
           -> update_from_output(plan) (record, hold, release held tokens, hand off) -> observe

Each phase is a call into the object that owns it: the `planner` (the one owner of the
queues: which rows the forward computes, every policy decision checked and applied, every
release), the batch build (the plan's rows packed for the executor; it reads the plan alone),
the held tokens (sampled tokens on the device until the output policy lets them home). Ends
from outside (`aborts`) and a cluster replica's parked requests (`planner.parking`, kept only by a
replica with a role) are objects of their own. The pool hides whether prefixes are cached
(`block_pool`, `prefix_cache`). Every mutation of sequences and blocks happens in these
objects, after the engine has validated the policy's decision, so the invariants live in one
place and are checked every step (`invariants`). The clock is given once, when the engine is built.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from framework.api.policy import Scheduler, overrides
from framework.core.request import RequestSpec
from framework.core.sequence import ABORTED, Sequence, Status, sequences_for
from framework.core.step_stats import StepStats
from framework.engine.aborts import Aborts
from framework.engine.batch import StepBatch
from framework.engine.batch_build import BatchBuilder
from framework.engine.block_pool import BlockPool
from framework.engine.clock import Clock, WallClock
from framework.engine.costs import MeasuredCosts
from framework.engine.counters import Counters
from framework.engine.executor import ExecResult, Executor, describe
from framework.engine.gc_freeze import frozen_heap
from framework.engine.held import HeldTokens
from framework.engine.host_tier import HostTier, SwapCosts
from framework.engine.invariants import InvariantError, check_end, check_step, check_writes
from framework.engine.kv_usage import account_kv, overhang
from framework.engine.parking import Parking
from framework.engine.phases import PhaseTimer
from framework.engine.planner import Planner
from framework.engine.readback import Readback
from framework.engine.rejection import why_never
from framework.engine.settings import GuardedPolicies, Limits, Policies
from framework.engine.step_log import StepLog
from framework.engine.step_plan import StepPlan

if TYPE_CHECKING:
    from collections import deque


@dataclass
class RunResult:
    """What the engine counted in a run; `framework.run.summary.summarize` makes it the
    flat summary of `metrics.json`."""

    seqs: list[Sequence]
    steps: Seq[StepStats]  # a StepLog from the engine: see step_log.py
    counters: Counters
    max_num_seqs: int
    peak_blocks: int
    num_blocks: int
    clock: str = "wall"  # which clock the times are on: "wall" or "virtual"
    executor: dict[str, str] = field(default_factory=dict)  # what produced the steps


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
        host_pool: BlockPool | None = None,
        kv_block_bytes: int = 0,
    ) -> None:
        """`host_pool`: the host KV tier's blocks, where preemption may swap a victim's KV
        (`kv_block_bytes` each); the executor then copies them (`SwapCosts`)."""
        self.executor = executor
        self.pool = pool
        # The model's context, which a reservation rule may book whole (Orca's `max`).
        policies.allocator.set_context(limits.max_model_len)
        self.p = GuardedPolicies.of(policies)
        self.limits = limits
        self.hooks = hooks
        self.check_invariants = check_invariants
        # Every timestamp goes through this one clock, given here and never replaced: the
        # planner and the held tokens stamp their times on it too.
        self.clock: Clock = clock or WallClock()
        self.seqs: list[Sequence] = []
        self.steps = StepLog()
        self.counters = Counters()
        self.costs = MeasuredCosts()
        self.timer = PhaseTimer()
        self.readback = Readback(device or torch.device("cpu"))
        # a step's device seconds reach its row of the step log when drained
        self.held = HeldTokens(
            self.readback, self.costs, self.clock, self.counters, self.timer, self.steps
        )
        tier = None
        if host_pool is not None:
            if not isinstance(executor, SwapCosts):
                raise ValueError(f"{type(executor).__name__} cannot swap KV to a host tier")
            tier = HostTier(host_pool, self.counters, kv_block_bytes, executor)
        self.planner = Planner(
            pool, self.p, limits, self.counters, self.held, self.steps, self.clock, tier
        )
        self.aborts = Aborts(self.planner, self.held, self.counters)
        self.builder = BatchBuilder(pool.block_size, scratch_block, self.planner.fail)
        # Prefill/decode disaggregation, set by a cluster for a `prefill` replica: the
        # output tokens it generates of each request before handing it off (1: the first).
        # None: every token, as one engine.
        self.tokens_here: int | None = None

    # The queues, read through their one owner (the planner): a router's and a server's view.
    @property
    def pending(self) -> deque[Sequence]:
        return self.planner.pending

    @property
    def waiting(self) -> deque[Sequence]:
        return self.planner.waiting

    @property
    def running(self) -> list[Sequence]:
        return self.planner.running

    @property
    def parking(self) -> Parking | None:  # None: it parks nothing (`attach_parking`)
        return self.planner.parking

    @property
    def joining(self) -> Seq[Sequence]:
        """Parked requests whose KV is arriving here, to join the rows once it has landed."""
        return list(self.planner.parking.joining) if self.planner.parking is not None else []

    def attach_parking(self, parking: Parking) -> None:
        """Requests will hold blocks here outside the running rows, kept by `parking` (a
        cluster's replica with a role): rows whose part here is done leave to it, requests
        whose KV it brings join from it."""
        if self.planner.parking is not None:
            raise InvariantError("an engine's parked requests have one keeper")
        self.planner.parking = parking

    @property
    def cuts_prefills(self) -> bool:
        """The scheduler cuts prefills (it has a `chunk` of its own): then a request longer
        than the token budget is served in chunks, not rejected."""
        return overrides(self.p.scheduler, Scheduler, "chunk")

    def now(self) -> float:
        return self.clock.now()

    # ---- run -------------------------------------------------------------------------
    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> RunResult:
        # The workload, the model and, once made, the sequences live until the run ends:
        # kept out of the garbage collector's full passes meanwhile (`frozen_heap`).
        with frozen_heap() as freeze:
            self.prepare()
            self.seqs = [s for spec in specs for s in sequences_for(spec, eos_token_id)]
            if len({s.id for s in self.seqs}) != len(self.seqs):
                raise ValueError("workload request ids must be unique")
            for seq in sorted(self.seqs, key=lambda s: s.arrival):
                self._enqueue(seq)
            freeze()
            self.clock.start()
            while self.has_work:
                self.advance()
        return self.finish()

    def prepare(self) -> None:
        """Settings read once from the executor and the policies, before the first step."""
        # A prompt's cache slots are a list as long as the prompt; an executor that reads the
        # rows' shapes only (the simulator) says so, and the build skips mapping them.
        self.builder.map_slots = getattr(self.executor, "reads_slots", True)
        self.held.price_readbacks(getattr(self.executor, "readback_s", None))
        # A scheduler that keeps a default is not asked for it: a view a step fewer.
        self.planner.displaces = overrides(self.p.scheduler, Scheduler, "displace")
        self.planner.pauses = overrides(self.p.scheduler, Scheduler, "pause")
        self.planner.lookups.cuts_prefills = self.cuts_prefills

    def submit(self, spec: RequestSpec, eos_token_id: int | None) -> list[Sequence]:
        """One more request, arriving no earlier than any submitted before it (a cluster's
        router hands each replica its requests one at a time, in arrival order): the
        sequences serving it, its samples in index order (one unless `sampling.n`)."""
        seqs = sequences_for(spec, eos_token_id)
        for seq in seqs:
            if self.tokens_here is not None:
                seq.stop_here_after(self.tokens_here)
            self.seqs.append(seq)
            self._enqueue(seq)
        return seqs

    def _enqueue(self, seq: Sequence, now: bool = False) -> None:
        """`seq` queued (arrived by now when `now`), or rejected where it could never run.
        A request's samples are queued with their leader."""
        reason = why_never(seq, self.pool, self.limits, self.p.allocator, self.cuts_prefills)
        group = seq.group
        if reason:  # a request's samples alike: one prompt, one length
            seq.status, seq.reject_reason = Status.REJECTED, reason
        elif group is None:
            self.planner.enqueue(seq, now=now)
        elif seq is group.leader:  # the others wait to fork from it (`Forks.ready`)
            self.planner.enqueue(seq)
            self.planner.hold(group)

    @property
    def has_work(self) -> bool:
        q = self.planner
        landed = q.parking is not None and q.parking.next_landing() is not None
        return bool(q.pending or q.waiting or q.running or q.forking or landed)

    def next_work(self) -> float:
        """When an engine with nothing queued or running next has something to do: its next
        arrival, or the landing of a request's KV (a decode replica), whichever is first."""
        times = []
        q = self.planner
        if q.pending:
            times.append(q.pending[0].arrival)
        if q.parking is not None and (at := q.parking.next_landing()) is not None:
            times.append(at)
        return min(times)

    def advance(self) -> StepStats | None:
        """One step (its stats; None if nothing ran), the clock first at the next arrival."""
        if not (q := self.planner).waiting and not q.running:
            q.arrive(self.now())  # samples whose leader has left wait now: no wait for them
            if not q.waiting:
                self.clock.wait_until(self.next_work())
        return self.step()

    def finish(self) -> RunResult:
        """The result, after the books are checked whole (`check_end`)."""
        result = self.partial_result()
        if self.check_invariants:
            check_end(self.seqs, self.pool, self.counters, self.held.on_device)
            if self.planner.tier is not None:
                self.planner.tier.check(self.seqs, end=True)
        return result

    def partial_result(self) -> RunResult:
        """What has been measured so far: the whole result after `run`, or, after a run stopped
        by an error or Ctrl-C, the part worth writing down (marked incomplete by the caller)."""
        return RunResult(
            self.seqs,
            self.steps,
            self.counters,
            self.limits.max_num_seqs,
            self.pool.peak_used,
            self.pool.num_blocks,
            clock=self.clock.name,
            executor=describe(self.executor) | self.held.settle(),  # spans left unread, read
        )

    # ---- ends from outside, and a cluster's hand-offs ---------------------------------
    def abort(self, seq: Sequence, reason: str = ABORTED) -> None:
        """End `seq` before its stop or length (`Aborts.abort`); between steps only."""
        if self.aborts.abort(seq, reason):
            self._notify([seq])

    def take_over(self, copy: Sequence) -> None:
        """A request re-routed from a failed replica (`Sequence.copy_for`) joins the
        waiting queue now, behind those that have arrived here by now."""
        self.seqs.append(copy)
        self._enqueue(copy, now=True)

    def reserve_for(self, seq: Sequence) -> bool:
        """Blocks for a request whose KV will arrive here from elsewhere, reserved before any
        of it is sent: priced as an admission (the allocator's `blocks_to_admit` and
        `admits`, as the planner asks them) of the request as it arrives. True: reserved,
        and the request is this engine's, parked until it lands; False: not now."""
        bs, allocator = self.pool.block_size, self.p.allocator
        n = allocator.blocks_to_admit(seq, bs)
        if not isinstance(n, int) or n * bs < seq.num_tokens:
            raise self.planner.fail(
                "allocator", f"priced {seq.id}'s {seq.num_tokens} arriving tokens at {n!r} blocks"
            )
        if not self.pool.can_place([n]) or not allocator.admits(
            self.planner.view(), seq, self.pool.num_free
        ):
            return False
        seq.block_table = self.pool.allocate(seq.id, n)
        self.seqs.append(seq)
        self.counters.kv_overhang_slots += overhang(seq, bs)
        return True

    # ---- one step --------------------------------------------------------------------
    def step(self) -> StepStats | None:
        self.timer.start()
        self.held.begin_step()
        self.planner.arrive(self.now())
        if self.aborts.aborting:
            if self.held.count:  # the aborted rows leave: every held token home first
                self.bring_home()
            self.aborts.end_running()
        transfers = self.counters.transfers
        plan = self._plan()
        if not plan.rows:
            self._idle()
            return None
        batch = self.builder.build(plan, self.held.newest, len(self.planner.waiting))
        if self.check_invariants:  # copy on write: checked before the forward writes
            check_writes(batch, self.pool)
        self.timer.lap("build")
        result, ready_at = self._execute(batch)
        wasted, states = self.update_from_output(plan, batch, result, ready_at)
        kept, finished = self.held.take()
        self._notify(finished)
        stats = self._stats(batch, plan, kept, wasted, transfers)
        if self.planner.pauses:  # rows sat out: every running row's states, not the forward's
            states = sum(s.num_computed for s in self.planner.running)
        last = self.steps[-1].time if self.steps else 0.0
        account_kv(self.counters, self.pool, states, stats.time - last)
        if self.check_invariants:
            self._check(batch, stats.window)
        self.hooks.on_step_end(stats=stats)
        self.timer.lap("hooks")
        self.clock.account(self.timer.close(), len(batch.rows))
        self.steps.append(stats)
        return stats

    def _plan(self) -> StepPlan:
        """The planner's plan, the held tokens brought home whenever it yields for them."""
        planning = self.planner.plan(self.timer)
        while True:
            try:
                next(planning)
            except StopIteration as done:
                plan: StepPlan = done.value
                return plan
            self.bring_home()

    def bring_home(self) -> None:
        """Every held token reaches its request now (`HeldTokens.drain_all`: stops, finishes)
        and the rows whose part here is done leave for their hand-off: with
        `update_from_output`, the one place where tokens reach requests."""
        self.held.drain_all()
        self.planner.hand_off()

    def _idle(self) -> None:
        """Nothing runs this step: a scheduler that admits no one while requests wait and
        none is still to arrive would stall the run forever (unless blocks held for KV
        transfers, which will be freed, are what keeps them out)."""
        self._notify(self.held.take()[1])
        q = self.planner
        if q.waiting and not q.pending and not q.parking:
            raise self.planner.fail(
                "scheduler",
                f"admitted nothing while the engine is idle and {len(q.waiting)} requests wait",
            )

    def _execute(self, batch: StepBatch) -> tuple[ExecResult, float]:
        """The forward and sampling, timed. Returns the executor's result and when the
        step's tokens exist on the device."""
        self.clock.executing(len(batch.rows))
        result = self.executor.execute(batch)
        ready_at, waited = self.clock.executed(
            result.prepare_s + result.host_s, result.swap_s + result.forward_s + result.sample_s
        )
        timer = self.timer
        timer.wait += waited  # a simulated GPU still busy with the step before
        # the executor's tensor preparation is host work, even though the executor does it
        timer.add("build", result.prepare_s)
        if result.host_s:  # a simulated engine's software (`executor.software`)
            timer.add("software", result.host_s)
        if result.swap_s:  # KV copied between the tiers before the forward
            timer.add("swap", result.swap_s)
        timer.add("forward", result.forward_s)
        timer.add("sample", result.sample_s)
        timer.skip()
        if batch.decode_rows == len(batch.rows) and result.span is None:  # else at its drain
            self.costs.observe_forward(len(batch.rows), result.forward_s)
        return result, ready_at

    def update_from_output(
        self, plan: StepPlan, batch: StepBatch, result: ExecResult, ready_at: float
    ) -> tuple[int, int]:
        """Every change the forward makes, in one place: each planned row's computed
        positions advance, its written blocks published, its sampled token held on the
        device; the output policy keeps the newest held steps there, the rest reach their
        requests (`HeldTokens.apply`); rows done here are handed off. Returns the rows whose
        token nobody keeps, and the token states the rows' blocks hold."""
        rows = plan.rows
        wasted = states = 0
        unkept: list[bool] = []  # rows whose token nobody keeps
        for seq, row in zip(rows, batch.rows, strict=True):
            if row.padding:
                wasted += 1
                unkept.append(True)
                states += seq.num_computed
            else:
                seq.num_computed = row.ctx_len  # start_pos + its tokens
                states += row.ctx_len
                if row.samples:  # a chunk short of the end samples nothing
                    seq.num_held += 1
                unkept.append(not row.samples)
        counters = self.counters
        self.pool.publish_written(rows, counters)
        counters.token_slots += batch.sampling_rows
        counters.prefill_tokens += batch.prefill_tokens
        counters.prefill_chunks += len(batch.rows) - batch.decode_rows
        tokens = self.held
        tokens.hold(rows, unkept, result, self.p.output.window(), ready_at)
        held = tokens.count
        keep = self.p.output.keep(tokens.view(len(self.steps), rows))
        if not 0 <= keep <= held:
            raise self.planner.fail("output", f"asked to keep {keep} of {held} held steps")
        drained = tokens.drain(held - keep)
        self.timer.lap("output")
        tokens.apply(drained)
        self.timer.lap("apply")
        self.planner.hand_off()
        return wasted, states

    def _stats(
        self, batch: StepBatch, plan: StepPlan, kept: int, wasted: int, transfers: int
    ) -> StepStats:
        rows = len(batch.rows)
        return StepStats(
            step=len(self.steps),
            time=self.now(),
            rows=rows,
            paused_rows=plan.paused,
            prefill_rows=rows - batch.decode_rows,
            prefill_tokens=batch.prefill_tokens,
            decode_rows=batch.decode_rows,
            decode_tokens=batch.decode_rows,
            partial_rows=rows - batch.sampling_rows,
            wasted_rows=wasted,
            tokens_kept=kept,
            admitted=plan.admitted,
            evicted=plan.evicted,
            preempted=plan.preempted,
            waiting=len(self.planner.waiting),
            blocks_in_use=self.pool.num_used,
            transfers=self.counters.transfers - transfers,
            held_steps=self.held.count,
            swapped_out=len(plan.swaps.out),
            swapped_in=len(plan.swaps.into),
            block_references=self.pool.references(),
            copied_blocks=len(plan.copies),
            window=self.p.output.window(),  # after `keep`, which may have moved it
            phase_s=self.timer.phases,
        )

    def _check(self, batch: StepBatch, window: float) -> None:
        check_step(
            batch,
            running=self.planner.running,
            parked=[*q.leaving, *q.joining] if (q := self.planner.parking) is not None else [],
            pool=self.pool,
            counters=self.counters,
            held_steps=self.held.count,
            window=window,
            output_name=self.p.names.get("output", "?"),
            max_num_seqs=self.limits.max_num_seqs,
            max_num_batched_tokens=self.limits.max_num_batched_tokens,
        )

    def _notify(self, finished: list[Sequence]) -> None:
        for seq in finished:
            self.hooks.on_request_finished(request=seq)
