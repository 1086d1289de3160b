"""Invariants as code: checked cheaply every step and fully at the end of every run.

A failure raises `InvariantError` at once: a run whose books do not balance must not be
reported as a result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.core.sequence import ENDED_OUTSIDE, Sequence, Status
from framework.engine.block_pool import BlockPool, BlockPoolError
from framework.engine.counters import Counters

if TYPE_CHECKING:
    from framework.engine.batch import StepBatch


class InvariantError(AssertionError):
    """The engine's bookkeeping is inconsistent: a bug, never a user error."""


def check_step(
    batch: StepBatch,
    *,
    running: list[Sequence],
    pool: BlockPool,
    counters: Counters,
    held_steps: int,
    window: float,
    output_name: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    parked: list[Sequence] | None = None,
) -> None:
    """O(running) checks after each step, on the engine's state passed in by name (this
    module never imports the engine, which calls it). `parked` are the requests that hold
    blocks without a row: handed off and not yet sent, or reserved for a KV transfer."""
    if len(batch.rows) > max_num_seqs:
        raise InvariantError(f"step ran {len(batch.rows)} rows > max_num_seqs {max_num_seqs}")
    if batch.num_tokens > max_num_batched_tokens:
        raise InvariantError(
            f"step ran {batch.num_tokens} tokens > max_num_batched_tokens {max_num_batched_tokens}"
        )
    # The counts the engine took while packing the batch (`StepBatch.counted`) are its rows'.
    # (One pass over the rows and one over the running sequences: a whole day's trace checks
    # a million steps of a few rows, where each extra pass is a measurable share.)
    tokens = prefill = 0
    for r in batch.rows:
        n = len(r.token_ids)
        tokens += n
        if r.in_prefill:
            prefill += n
    if (tokens, prefill) != (batch.num_tokens, batch.prefill_tokens):
        raise InvariantError(
            f"the batch says {batch.num_tokens} tokens ({batch.prefill_tokens} prefill); its "
            f"rows hold {tokens} ({prefill} prefill)"
        )
    tables = {s.id: s.block_table for s in running}
    if parked:
        for s in parked:
            if s.id in tables:
                raise InvariantError(f"{s.id} holds blocks both as a running row and parked")
            tables[s.id] = s.block_table
    try:  # per pool kind: one owner a block, or reference counts (prefix caching)
        pool.check_tables(tables)
    except BlockPoolError as exc:
        raise InvariantError(str(exc)) from exc
    c = counters
    if c.deferred_tokens != c.tokens_kept + c.overshoot_tokens + c.held_tokens + c.lost_tokens:
        raise InvariantError(
            f"token conservation broken: deferred {c.deferred_tokens} != kept {c.tokens_kept}"
            f" + overshoot {c.overshoot_tokens} + held {c.held_tokens} + lost {c.lost_tokens}"
        )
    if held_steps > window:
        raise InvariantError(
            f"output policy {output_name!r} left {held_steps} steps held, over its window {window}"
        )
    held = 0
    bs = pool.block_size
    for s in running:
        held += s.num_held
        if s.finished:
            continue
        if s.num_computed > len(s.block_table) * bs:
            raise InvariantError(
                f"{s.id} has {s.num_computed} tokens cached in {len(s.block_table)} blocks"
            )
        # Every unfinished row has a token left to compute: its newest (sampled) token, or
        # the rest of a chunked prefill, which samples nothing until it reaches its end.
        total = s.total_len
        if s.num_computed >= total or (
            s.num_computed < total - 1 and s.num_computed >= s.prefill_end
        ):
            raise InvariantError(
                f"{s.id} computed {s.num_computed} of {total} tokens (prefill ends at "
                f"{s.prefill_end}): a row sampled before its prefill was done, or lost a token"
            )
    if held != c.held_tokens:
        raise InvariantError(
            f"rows hold {held} tokens on the device, the counter says {c.held_tokens}"
        )


def check_writes(batch: StepBatch, pool: BlockPool) -> None:
    """Before the forward: where some block is shared, no row writes into one. (After it, a
    beam search's round may have shared what the step wrote: `framework.engine.beams`.)"""
    if pool.references() != pool.num_used:
        _check_no_shared_write(batch, pool)


def _check_no_shared_write(batch: StepBatch, pool: BlockPool) -> None:
    """Copy on write held: no row wrote into a block another table holds. The blocks a table
    shares lead it (a fork's prompt, a prefix cache's hits) and a row writes a run of
    positions at its end, so the first block it wrote is the one that could be shared."""
    bs = pool.block_size
    for r in batch.rows:
        if r.padding or not r.token_ids:
            continue
        b = r.block_table[r.start_pos // bs]
        if (n := pool.refcount(b)) > 1:
            raise InvariantError(
                f"{r.seq_id} wrote position {r.start_pos} into block {b}, which {n} tables hold "
                "(a write into a shared block, not copied first)"
            )


def check_end(seqs: list[Sequence], pool: BlockPool, counters: Counters, held: list[Any]) -> None:
    """Every request accounted for, every block home, every token owed delivered. A request
    that moved (`MOVED`: handed on, or its replica failed) owes the rest elsewhere: here it
    delivered what it did; a copy that came with its KV delivered all but those it
    `carried`, one that came after a failure all but those it was `rerouted` with."""
    done = (Status.RELEASED, Status.REJECTED, Status.MOVED)
    lost = [s.id for s in seqs if s.status not in done]
    if lost:
        raise InvariantError(f"requests neither finished nor rejected: {lost[:10]}")
    if held or counters.held_tokens:
        raise InvariantError(f"{len(held)} steps of sampled tokens never reached the host")
    ends = counters.tokens_kept + counters.overshoot_tokens + counters.lost_tokens
    if counters.deferred_tokens != ends:
        raise InvariantError(
            f"token conservation broken at the end: deferred {counters.deferred_tokens} != kept "
            f"{counters.tokens_kept} + overshoot {counters.overshoot_tokens} + lost "
            f"{counters.lost_tokens}"
        )
    if counters.kv_overhang_slots:
        raise InvariantError(
            f"{counters.kv_overhang_slots} slots reserved past requests' lengths are still "
            "counted after every request left"
        )
    pool.check()
    if pool.num_used:
        raise InvariantError(f"{pool.num_used} KV blocks leaked: {pool.owners()}")
    delivered = 0
    for s in seqs:
        if s.status is Status.REJECTED:
            if s.output_token_ids:
                raise InvariantError(f"rejected request {s.id} has output")
            continue
        n = len(s.output_token_ids)
        delivered += n - s.carried - s.rerouted
        stops = s.stop_ids
        if any(t in stops for t in s.output_token_ids[:-1]):
            raise InvariantError(f"{s.id} kept tokens after a stop token")
        if s.status is Status.MOVED:  # a copy elsewhere owes the rest
            if s.finish_reason is not None or s.block_table:
                raise InvariantError(f"{s.id} moved on finished or holding blocks")
            continue
        if s.finish_reason == "length" and n != s.sampling.max_tokens:
            raise InvariantError(f"{s.id} finished by length with {n} != {s.sampling.max_tokens}")
        if s.finish_reason == "stop" and (
            n > s.sampling.max_tokens or s.output_token_ids[-1] not in stops
        ):
            raise InvariantError(f"{s.id} finished by stop without a stop token last")
        if s.finish_reason in ENDED_OUTSIDE:
            if n > s.sampling.max_tokens or s.block_table:
                raise InvariantError(f"{s.id} ended from outside with {n} tokens or blocks held")
            continue
        if s.sampling.ignore_eos and not s.sampling.stop_token_ids and n != s.sampling.max_tokens:
            raise InvariantError(
                f"{s.id} ignores EOS but got {n} of {s.sampling.max_tokens} tokens"
            )
    if delivered + counters.pruned_tokens != counters.tokens_kept:
        raise InvariantError(
            f"requests hold {delivered} tokens and beam search dropped "
            f"{counters.pruned_tokens}; the engine kept {counters.tokens_kept}"
        )
