"""What a run measured, as the flat summary of `metrics.json`, kept in two kinds: counts that
hold on any machine, and times that hold only on this one. The keys are a stable, documented
interface; `COUNT_KEYS` names the counts.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import numpy as np

from framework.cluster.result import ClusterResult
from framework.core.sequence import ABORTED, Sequence, Status
from framework.core.step_stats import PHASES, StepStats, step_value
from framework.engine.held import DEVICE_TIMED
from framework.engine.step_log import StepLog
from framework.run.kv_shares import kv_shares

if TYPE_CHECKING:
    from framework.engine.loop import RunResult


def _pct(values: list[float] | np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _total(steps: Seq[StepStats], column: str) -> float:
    """A steps.csv column summed in step order (a step log's own column, else each step's)."""
    if isinstance(steps, StepLog):
        values = steps.column(column)
    else:
        values = np.fromiter((step_value(st, column) for st in steps), np.float64, len(steps))
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def summarize(result: RunResult) -> dict[str, Any]:
    """The flat summary written to metrics.json (None where a value is undefined)."""
    seqs, steps, counters = result.seqs, result.steps, result.counters
    max_num_seqs = result.max_num_seqs
    # A request whose client went away (`Engine.abort`) is released unfinished: its times
    # are no request's latency, and it is counted apart (`aborted`).
    done = [s for s in seqs if s.status == Status.RELEASED and s.finish_reason != ABORTED]
    n_steps = len(steps)
    # A prefill replica's requests handed off to a decode replica had their first token
    # here: their TTFT is this replica's doing.
    here = [s for s in seqs if s.status is Status.RELEASED or s.handed_on]
    first = [s for s in here if s.finish_reason != ABORTED]
    ttft = [s.first_token_at - s.arrival for s in first if s.first_token_at is not None]
    e2e = [s.finished_at - s.arrival for s in done if s.finished_at is not None]
    tpot = [
        (s.finished_at - s.first_token_at) / (len(s.output_token_ids) - 1)
        for s in done
        if s.finished_at is not None
        and s.first_token_at is not None
        and len(s.output_token_ids) > 1
    ]
    # Time between tokens (TBT, Sarathi-Serve's name): every gap between consecutive tokens
    # of a request, pooled. Its tail is the decode stall that a long prefill causes and
    # chunked prefill removes. (numpy per request: a whole day's trace has four million gaps.)
    gaps = [np.diff(s.token_times) for s in done if len(s.token_times) > 1]
    tbt: np.ndarray | list[float] = np.concatenate(gaps) if gaps else []
    # Normalized latency (vLLM's): a request's end-to-end latency over its output tokens,
    # so that long and short answers weigh alike; its mean is the paper's curve.
    normalized = [
        (s.finished_at - s.arrival) / len(s.output_token_ids)
        for s in done
        if s.finished_at is not None and s.output_token_ids
    ]
    # Scheduling delay (Sarathi-Serve's): arrival to the first admission, the queueing a
    # scheduler adds before any work starts (a preempted request keeps its first).
    delay = [
        s.admitted_at - s.arrival
        for s in seqs
        if s.admitted_at is not None and s.finish_reason != ABORTED
    ]
    # When the last request's part here ended: its finish, or for one handed off to a decode
    # replica (a prefill replica's), its first token.
    ends = [s.finished_at if s.status is Status.RELEASED else s.first_token_at for s in first]
    makespan = max((t for t in ends if t is not None), default=0.0)
    # Each phase summed in step order, from the step log's columns (a whole day's trace is
    # a million steps: a Python pass over them as objects took seconds).
    phase_total = {p: _total(steps, f"{p}_s") for p in PHASES}
    # On a virtual clock whose device runs beside the host (a simulated GPU,
    # `executor.overlap`), `forward` and `sample` are the device's seconds, spent while the
    # host's phases go on: a step's time is the host's timeline, every other phase. So too on
    # a real GPU, whose forward and sampling are timed by events on the device (`forward_time`
    # device: the host's launches of them are its `host` phase). (A real run on a CPU times
    # every phase on the host, waits included, so they all add up.)
    said = result.executor
    beside = (result.clock == "virtual" and said.get("overlap") == "host and device") or (
        DEVICE_TIMED.items() <= said.items()
    )
    step_total = sum(  # a swap's copies are the device's too (before the forward)
        v for p, v in phase_total.items() if not (beside and p in ("forward", "sample", "swap"))
    )
    slots = counters.token_slots
    summary: dict[str, Any] = {
        # counts: the same on any machine
        "requests": len(seqs),
        "requests_finished": len(done),
        "requests_rejected": sum(1 for s in seqs if s.status == Status.REJECTED),
        "aborted": counters.aborted,  # their client went away (a server's)
        "stop_strings": counters.stop_strings,  # ended at a stop string in their text
        "steps": n_steps,
        "token_slots": slots,
        "tokens_kept": counters.tokens_kept,
        "prefill_tokens": counters.prefill_tokens,
        "prefill_chunks": counters.prefill_chunks,
        "prefix_query_tokens": counters.prefix_query_tokens,
        "prefix_hit_tokens": counters.prefix_hit_tokens,
        "prefix_hit_rate": (
            counters.prefix_hit_tokens / counters.prefix_query_tokens
            if counters.prefix_query_tokens
            else 0.0
        ),
        "prefix_recompute_hit_tokens": counters.prefix_recompute_hit_tokens,
        "prefix_evictions": counters.prefix_evictions,
        "waste_fraction": (slots - counters.tokens_kept) / slots if slots else 0.0,
        "occupancy": counters.tokens_kept / (max_num_seqs * n_steps) if n_steps else 0.0,
        # Rows of a step's forward, averaged over steps.
        "mean_rows": _total(steps, "rows") / n_steps if n_steps else 0.0,
        # Requests in the running batch a step, the forward's rows and those that sat it out
        # (a prefill-only step's decodes, `scheduler=prefill_first`), averaged over steps: the
        # vLLM paper's "average number of batched requests" (its Fig. 13), what a memory
        # manager lets a batch hold. Equal to mean_rows where no row ever sits out.
        "mean_batched": (_total(steps, "rows") + _total(steps, "paused_rows")) / n_steps
        if n_steps
        else 0.0,
        "preemptions": counters.preemptions,
        "recomputed_tokens": counters.recomputed_tokens,
        # preemption by swap to the host KV tier (engine.host_kv_memory_mb)
        "swapped_out_blocks": counters.swapped_out_blocks,
        "swapped_in_blocks": counters.swapped_in_blocks,
        "swapped_out_bytes": counters.swapped_out_bytes,
        "swapped_in_bytes": counters.swapped_in_bytes,
        "swap_fallbacks": counters.swap_fallbacks,
        # parallel samples forked over one prompt (sampling.n): forks, the blocks they took
        # shared, and the blocks copied for them to write (copy on write)
        "forks": counters.forks,
        "forked_blocks": counters.forked_blocks,
        "cow_blocks": counters.cow_blocks,
        # beam search (sampling.beam_width): rounds chosen, beams that took another's
        # blocks, and tokens kept then dropped (hypotheses not returned, or shorter)
        "beam_rounds": counters.beam_rounds,
        "beam_retables": counters.beam_retables,
        "pruned_tokens": counters.pruned_tokens,
        # blocks saved by sharing over the blocks the tables would hold without it, as the
        # vLLM paper's Fig. 15 (1 - 1 / the time-averaged references per block in use);
        # forks and prefix-cache hits alike. Weighted by step times: on the wall clock a
        # model run's varies a little with the machine.
        "kv_sharing_saving": (
            1.0 - counters.kv_in_use_s / counters.kv_sharing_ratio_s
            if counters.kv_sharing_ratio_s > 0
            else 0.0
        ),
        "peak_blocks": result.peak_blocks,
        "num_blocks": result.num_blocks,
        "transfers": counters.transfers,
        "transfers_per_step": counters.transfers / n_steps if n_steps else 0.0,
        "deferred_tokens": counters.deferred_tokens,
        "overshoot_tokens": counters.overshoot_tokens,
        "expected_overshoot": counters.expected_overshoot,
        "window": _total(steps, "window") / n_steps if n_steps else 0.0,
        # times: this machine only
        "makespan_s": makespan,
        "output_tokens_per_s": counters.tokens_kept / makespan if makespan > 0 else 0.0,
        "first_answer_s": min(
            (s.finished_at for s in done if s.finished_at is not None), default=None
        ),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p90_s": _pct(tpot, 90),
        "tpot_p99_s": _pct(tpot, 99),
        "tbt_p50_s": _pct(tbt, 50),
        "tbt_p99_s": _pct(tbt, 99),
        "normalized_latency_s": float(np.mean(normalized)) if normalized else None,
        "scheduling_delay_mean_s": float(np.mean(delay)) if delay else None,
        "scheduling_delay_p50_s": _pct(delay, 50),
        "scheduling_delay_p99_s": _pct(delay, 99),
        "e2e_mean_s": float(np.mean(e2e)) if e2e else None,
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p90_s": _pct(e2e, 90),
        "e2e_p99_s": _pct(e2e, 99),
        "step_mean_s": step_total / n_steps if n_steps else 0.0,
        # The device's seconds: the forward and the sampling (on a GPU, simulated or timed by
        # its events, what it is busy with beside the host; on a CPU, their host time).
        "busy_s": phase_total["forward"] + phase_total["sample"],
        # KV blocks copied between the device and the host tier (preemption by swap)
        "swap_s": phase_total["swap"],
    }
    summary.update(kv_shares(counters))  # the KV pool's time-averaged shares
    for p in PHASES:  # (with the device beside the host, forward's share is its busy share)
        summary[f"time_share_{p}"] = phase_total[p] / step_total if step_total else 0.0
    # Progress: every admission yields a token before its row can be preempted again, so a
    # request is preempted at most (its tokens - 1) times; this shows how close runs come.
    # (Not under chunked prefill: a row may be preempted part way through its prefill.)
    summary["max_preemptions_per_request"] = max((s.preemptions for s in seqs), default=0)
    # What the times are: the wall clock of this machine, or a simulation's virtual clock
    # (and then what predicted each step: a measured profile, or an analytic one).
    summary["clock"] = result.clock
    summary.update(result.executor)
    if isinstance(result, ClusterResult):
        if result.replicas:  # (a result made empty, to list the metrics, has none)
            summary.update(cluster_summary(result.replicas, result.roles))
        if result.transfers is not None:
            summary.update(transfer_summary(result))
        if result.replicas_of is not None:
            summary.update(failover_summary(result))
    return summary


def failover_summary(result: ClusterResult) -> dict[str, Any]:
    """A cluster's replica failures (`cluster.faults`; all 0 without): the failures, the
    requests they sent back to the router, the positions computed again on another replica
    and the sampled tokens that died on a device before reaching a client; and each outage
    as it happened."""
    outages = result.outages or []
    history = result.replicas_of or {}
    known = all(o.books_kept for o in outages)  # else a lost replica's counts died with it
    c = result.counters
    return {
        "replica_failures": len(outages),
        "requests_rerouted": sum(1 for v in history.values() if len(v) > 1),
        "tokens_recomputed_after_failure": c.failure_recomputed_tokens if known else None,
        "tokens_lost_in_failure": c.lost_tokens if known else None,
        "replica_outages": [o.as_dict() for o in outages],
    }


def transfer_summary(result: ClusterResult) -> dict[str, Any]:
    """A disaggregated cluster's KV transfers: how many, their bytes (every GPU's shard),
    their seconds from the reservation to the last byte landed, how long requests waited
    at their prefill replica for a decode replica's blocks, and the link."""
    moved = result.transfers or []
    seconds = [t.seconds for t in moved]
    waits = [t.wait_s for t in moved]
    return {
        "kv_transfers": len(moved),
        "kv_transfer_bytes": sum(t.bytes for t in moved),
        "kv_transfer_s_p50": _pct(seconds, 50),
        "kv_transfer_s_p99": _pct(seconds, 99),
        "kv_wait_s_p50": _pct(waits, 50),
        "kv_wait_s_p99": _pct(waits, 99),
    } | dict(result.link or {})


REPLICA_KEYS = (
    "requests", "requests_finished", "requests_rejected", "steps", "tokens_kept",
    "prefill_tokens", "prefix_hit_rate", "preemptions", "peak_blocks", "num_blocks",
    "makespan_s", "output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "e2e_p50_s", "busy_s",
)  # fmt: skip


def served_tokens(result: RunResult) -> int:
    """Prompt and output tokens of the requests a replica served: the work routed to it,
    whatever its cache saved. A decode replica served a handed-off request's output past
    the tokens it arrived with, not its prompt."""
    return sum(
        (0 if s.carried else s.prompt_len) + len(s.output_token_ids) - s.carried
        for s in result.seqs
    )


def cluster_summary(replicas: list[RunResult], roles: list[str] | None = None) -> dict[str, Any]:
    """A cluster's own figures: each replica's counts and times (and role, when roles are
    set), and how evenly the router spread the work (`load_imbalance`: the largest
    replica's served tokens over the mean; 1 is even)."""
    rows = []
    for i, r in enumerate(replicas):
        s = summarize(r)
        role = {"role": roles[i]} if roles is not None else {}
        rows.append(
            {"replica": i}
            | role
            | {"served_tokens": served_tokens(r)}
            | {k: s[k] for k in REPLICA_KEYS}
        )
    # Each replica's utilisation: its busy seconds over the cluster's makespan (the last
    # request's end on any replica), so replicas idle at the end count as idle.
    makespan = max(row["makespan_s"] for row in rows)
    for row in rows:
        row["utilisation"] = row["busy_s"] / makespan if makespan > 0 else 0.0
    served = [row["served_tokens"] for row in rows]
    mean = sum(served) / len(served)
    return {
        "cluster_replicas": len(replicas),
        "load_imbalance": max(served) / mean if mean else 1.0,
        "replicas": rows,
    }


COUNT_KEYS = (
    "requests",
    "requests_finished",
    "requests_rejected",
    "aborted",
    "stop_strings",
    "steps",
    "token_slots",
    "tokens_kept",
    "prefill_tokens",
    "prefill_chunks",
    "prefix_query_tokens",
    "prefix_hit_tokens",
    "prefix_hit_rate",
    "prefix_recompute_hit_tokens",
    "prefix_evictions",
    "waste_fraction",
    "occupancy",
    "mean_rows",
    "mean_batched",
    "preemptions",
    "recomputed_tokens",
    "forks",
    "forked_blocks",
    "cow_blocks",
    "beam_rounds",
    "beam_retables",
    "pruned_tokens",
    "peak_blocks",
    "num_blocks",
    "transfers",
    "transfers_per_step",
    "deferred_tokens",
    "overshoot_tokens",
    "expected_overshoot",
    "window",
    "max_preemptions_per_request",
)


def request_row(s: Sequence) -> dict[str, Any]:
    """One row of requests.csv."""
    return {
        "id": s.id,
        "status": s.status.value,
        "finish_reason": s.finish_reason or "",
        "reject_reason": s.reject_reason or "",
        "prompt_tokens": s.prompt_len,
        "output_tokens": len(s.output_token_ids),
        "max_tokens": s.sampling.max_tokens,
        "preemptions": s.preemptions,
        "priority": s.spec.priority,
        "arrival_s": s.arrival,
        "admitted_s": s.admitted_at,
        "first_token_s": s.first_token_at,
        "finished_s": s.finished_at,
        "released_s": s.released_at,
        "ttft_s": None if s.first_token_at is None else s.first_token_at - s.arrival,
        "e2e_s": None if s.finished_at is None else s.finished_at - s.arrival,
        "scheduling_delay_s": None if s.admitted_at is None else s.admitted_at - s.arrival,
        "normalized_latency_s": (
            None
            if s.finished_at is None or not s.output_token_ids
            else (s.finished_at - s.arrival) / len(s.output_token_ids)
        ),
        # One `%` a request (1.5x a format a token: a whole day's trace has four million)
        "token_times_s": " ".join(["%.6f"] * len(s.token_times)) % tuple(s.token_times),
    }
