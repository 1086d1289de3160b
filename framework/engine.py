"""The engine: one step at a time, policies decide and the engine applies.

    arrivals -> evict -> grow (preempt if dry) -> admit -> build -> forward+sample
             -> output (drain held tokens?) -> apply -> observe

Every mutation of sequences and blocks happens here, after the engine has validated the
policy's decision, so the invariants live in one place.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from framework.batch import Row, StepBatch
from framework.block_pool import BlockPool
from framework.executor import Executor
from framework.invariants import check_end, check_step
from framework.metrics import Counters, StepStats, summarize
from framework.policy import (
    Allocator,
    EngineView,
    OutputPolicy,
    OutputView,
    PolicyError,
    Preemption,
    Scheduler,
)
from framework.request import RequestSpec
from framework.sequence import Sequence, Status


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


@dataclass
class RunResult:
    seqs: list[Sequence]
    steps: list[StepStats]
    summary: dict[str, Any]


@dataclass
class _Held:
    """Sampled tokens of one step still on the device, and the rows that produced them."""

    rows: list[Sequence]
    discard: list[bool]
    tokens: torch.Tensor


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
    ) -> None:
        self.executor = executor
        self.pool = pool
        self.scratch_block = scratch_block
        self.p = policies
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
        self._admit_counter = 0
        self._t0 = 0.0

    # ---- run -------------------------------------------------------------------------
    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> RunResult:
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
        self._t0 = time.perf_counter()
        while self.pending or self.waiting or self.running:
            if not self.waiting and not self.running:
                wait = self.pending[0].arrival - self.now()
                if wait > 0:
                    time.sleep(wait)
            self.step()
        summary = summarize(
            self.seqs,
            self.steps,
            self.counters,
            self.limits.max_num_seqs,
            self.pool.peak_used,
            self.pool.num_blocks,
        )
        if self.check_invariants:
            check_end(self.seqs, self.pool, self.counters, self.held)
        return RunResult(self.seqs, self.steps, summary)

    def now(self) -> float:
        return time.perf_counter() - self._t0

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
        if seq.max_len > self.limits.max_num_batched_tokens:
            return (
                f"prompt + max_tokens = {seq.max_len} exceeds engine.max_num_batched_tokens "
                f"= {self.limits.max_num_batched_tokens} (a preempted request is prefilled "
                f"again whole)"
            )
        return None

    # ---- one step --------------------------------------------------------------------
    def step(self) -> StepStats | None:
        phase: dict[str, float] = {}
        t = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal t
            now = time.perf_counter()
            phase[name] = phase.get(name, 0.0) + now - t
            t = now

        now = self.now()
        while self.pending and self.pending[0].arrival <= now:
            seq = self.pending.popleft()
            seq.status = Status.WAITING
            self.waiting.append(seq)

        evicted = self._evict()
        lap("schedule")
        preempted = self._grow()
        lap("allocate")
        admitted = self._choose_admissions()
        lap("schedule")
        self._admit(admitted)
        lap("allocate")
        if not self.running:
            if self.waiting and not self.pending:
                raise self._fail(
                    "scheduler",
                    f"admitted nothing while the engine is idle and "
                    f"{len(self.waiting)} requests wait",
                )
            return None

        batch = self._build()
        lap("build")
        result = self.executor.execute(batch)
        phase["forward"] = result.forward_s
        phase["sample"] = result.sample_s
        t = time.perf_counter()
        for row_seq, row in zip(self.running, batch.rows, strict=True):
            if not row.discard:
                row_seq.num_computed = row.start_pos + len(row.token_ids)
        self.counters.token_slots += len(batch.rows)
        self.counters.prefill_tokens += batch.prefill_tokens
        self.held.append(_Held(list(self.running), [r.discard for r in batch.rows], result.tokens))

        transfers_before = self.counters.transfers
        drained = self._maybe_drain()
        lap("output")
        kept, finished = self._apply(drained)
        lap("apply")
        for seq in finished:
            self.hooks.on_request_finished(request=seq)
        stats = StepStats(
            step=len(self.steps),
            time=self.now(),
            rows=len(batch.rows),
            prefill_rows=len(batch.rows) - batch.decode_rows,
            prefill_tokens=batch.prefill_tokens,
            decode_rows=batch.decode_rows,
            wasted_rows=len(batch.rows) - kept,
            tokens_kept=kept,
            admitted=len(admitted),
            evicted=len(evicted),
            preempted=preempted,
            waiting=len(self.waiting),
            blocks_in_use=self.pool.num_used,
            transfers=self.counters.transfers - transfers_before,
            phase_s=phase,
        )
        if self.check_invariants:
            check_step(self, batch)
        self.hooks.on_step_end(stats=stats)
        lap("hooks")
        self.steps.append(stats)
        return stats

    def _view(self) -> EngineView:
        return EngineView(
            now=self.now(),
            step=len(self.steps),
            waiting=tuple(self.waiting),
            running=tuple(self.running),
            free_blocks=self.pool.num_free,
            block_size=self.pool.block_size,
            num_blocks=self.pool.num_blocks,
            max_num_seqs=self.limits.max_num_seqs,
            max_num_batched_tokens=self.limits.max_num_batched_tokens,
            blocks_to_admit=lambda s: self.p.allocator.blocks_to_admit(s, self.pool.block_size),
        )

    def _fail(self, group: str, msg: str) -> PolicyError:
        return PolicyError(f"{group} policy {self.p.names.get(group, '?')!r}: {msg}")

    # ---- schedule & allocate -----------------------------------------------------------
    def _evict(self) -> list[Sequence]:
        evict = self.p.scheduler.evict(self._view())
        for seq in evict:
            if seq not in self.running or not seq.finished:
                raise self._fail(
                    "scheduler", f"evicted {seq.id}, which is not a finished running row"
                )
        for seq in evict:
            self.running.remove(seq)
            self.pool.free(seq.id, seq.block_table)
            seq.block_table = []
            seq.status = Status.RELEASED
            seq.released_at = self.now()
        return evict

    def _lookahead(self, seq: Sequence) -> int:
        """Tokens sampled for `seq` but still held on the device (already in its cache)."""
        return sum(
            1
            for h in self.held
            for s, d in zip(h.rows, h.discard, strict=True)
            if s is seq and not d
        )

    def _grow(self) -> int:
        """Give running rows the blocks this step writes into; preempt while the pool is dry."""
        preempted = 0
        bs = self.pool.block_size
        while True:
            need = {
                s: self.p.allocator.blocks_to_grow(s, bs, self._lookahead(s))
                for s in self.running
                if not s.finished
            }
            short = sum(need.values()) - self.pool.num_free
            if short <= 0:
                break
            victims = self.p.preemption.victims(self._view(), short)
            if not victims:
                raise self._fail(
                    "preemption", f"named no victim while the pool is {short} blocks short"
                )
            for v in victims:
                if v not in self.running or v.finished:
                    raise self._fail(
                        "preemption", f"named {v.id}, which is not an unfinished running row"
                    )
                self._preempt(v)
                preempted += 1
        for seq, n in need.items():
            if n > 0:
                seq.block_table += self.pool.allocate(seq.id, n)
        return preempted

    def _preempt(self, seq: Sequence) -> None:
        self._drain_all()  # a held token of a changing batch must reach its request first
        self.running.remove(seq)
        self.pool.free(seq.id, seq.block_table)
        seq.block_table = []
        self.counters.preemptions += 1
        self.counters.recomputed_tokens += seq.num_computed
        seq.num_computed = 0
        seq.preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def _choose_admissions(self) -> list[Sequence]:
        admit = self.p.scheduler.admit(self._view())
        rows = len(self.running)
        tokens = sum(s.num_tokens - s.num_computed if not s.finished else 1 for s in self.running)
        blocks = 0
        waiting = set(map(id, self.waiting))
        for seq in admit:
            if id(seq) not in waiting:
                raise self._fail("scheduler", f"admitted {seq.id}, which is not waiting")
            waiting.discard(id(seq))
            rows += 1
            tokens += seq.num_tokens - seq.num_computed
            blocks += self.p.allocator.blocks_to_admit(seq, self.pool.block_size)
        if rows > self.limits.max_num_seqs:
            raise self._fail(
                "scheduler",
                f"batch of {rows} rows exceeds engine.max_num_seqs = {self.limits.max_num_seqs}",
            )
        if tokens > self.limits.max_num_batched_tokens:
            raise self._fail(
                "scheduler",
                f"step of {tokens} tokens exceeds "
                f"engine.max_num_batched_tokens = {self.limits.max_num_batched_tokens}",
            )
        if blocks > self.pool.num_free:
            raise self._fail(
                "scheduler", f"admissions need {blocks} blocks, {self.pool.num_free} are free"
            )
        return admit

    def _admit(self, admit: list[Sequence]) -> None:
        if admit:
            self._drain_all()
        for seq in admit:
            self.waiting.remove(seq)
            n = self.p.allocator.blocks_to_admit(seq, self.pool.block_size)
            seq.block_table = self.pool.allocate(seq.id, n)
            if n * self.pool.block_size < seq.num_tokens:
                raise self._fail(
                    "allocator", f"gave {seq.id} {n} blocks for {seq.num_tokens} tokens"
                )
            seq.status = Status.RUNNING
            seq.admit_order = self._admit_counter
            self._admit_counter += 1
            if seq.admitted_at is None:
                seq.admitted_at = self.now()
            self.running.append(seq)

    # ---- build -----------------------------------------------------------------------
    def _slot(self, seq: Sequence, pos: int) -> int:
        bs = self.pool.block_size
        return seq.block_table[pos // bs] * bs + pos % bs

    def _build(self) -> StepBatch:
        bs = self.pool.block_size
        rows: list[Row] = []
        for i, seq in enumerate(self.running):
            if seq.finished:
                # Still in a static batch: computed like a decode row, kept by nobody. Its
                # K/V goes to the scratch block so no live block is touched.
                scratch = self.scratch_block * bs + i % bs
                ctx = [self._slot(seq, p) for p in range(seq.num_computed)] + [scratch]
                rows.append(
                    Row(
                        seq.id,
                        [seq.all_token_ids()[-1]],
                        seq.num_tokens - 1,
                        [scratch],
                        ctx,
                        seq.sampling,
                        len(seq.output_token_ids),
                        discard=True,
                    )
                )
                continue
            start = seq.num_computed
            tokens = seq.all_token_ids()[start:]
            end = start + len(tokens)
            slots = [self._slot(seq, p) for p in range(start, end)]
            ctx = None if start == 0 else [self._slot(seq, p) for p in range(end)]
            rows.append(
                Row(seq.id, tokens, start, slots, ctx, seq.sampling, len(seq.output_token_ids))
            )
        return StepBatch(rows)

    # ---- output & apply --------------------------------------------------------------
    def _maybe_drain(self) -> list[tuple[Sequence, bool, int]]:
        view = OutputView(
            step=len(self.steps),
            held_steps=len(self.held),
            rows_changing=False,
            running=tuple(self.running),
        )
        if self.p.output.should_drain(view):
            return self._drain()
        return []

    def _drain(self) -> list[tuple[Sequence, bool, int]]:
        """Every held step home in one concatenation on the device and one transfer."""
        if not self.held:
            return []
        held, self.held = self.held, []
        flat = torch.cat([h.tokens for h in held]) if len(held) > 1 else held[0].tokens
        values = flat.tolist()
        self.counters.transfers += 1
        out: list[tuple[Sequence, bool, int]] = []
        i = 0
        for h in held:
            for seq, discard in zip(h.rows, h.discard, strict=True):
                out.append((seq, discard, values[i]))
                i += 1
        return out

    def _drain_all(self) -> None:
        """Drain before the rows change, applying what arrives (see design note 7)."""
        if self.held:
            _, finished = self._apply(self._drain())
            for seq in finished:
                self.hooks.on_request_finished(request=seq)

    def _apply(self, drained: list[tuple[Sequence, bool, int]]) -> tuple[int, list[Sequence]]:
        """Tokens reach their requests; stop and length checks; finish times stamped."""
        now = self.now()
        kept = 0
        finished: list[Sequence] = []
        for seq, discard, token in drained:
            if discard or seq.finished:
                continue
            seq.output_token_ids.append(token)
            seq.token_times.append(now)
            if seq.first_token_at is None:
                seq.first_token_at = now
            kept += 1
            if token in seq.stop_ids():
                seq.finish_reason = "stop"
            elif len(seq.output_token_ids) >= seq.sampling.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason:
                seq.status = Status.FINISHED
                seq.finished_at = now
                finished.append(seq)
        self.counters.tokens_kept += kept
        return kept, finished
