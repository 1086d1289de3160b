"""Soak: a long open-loop run under overload, to show the engine stays sound as it runs on.

    python -m experiments.soak                                 # 3000 requests, tiny model
    python -m experiments.soak --requests 300 --out /tmp/soak scheduler=sjf

Thousands of requests arrive (Poisson) faster than the tiny model serves them, so the waiting
queue builds into the thousands and drains again, through a KV pool so tight that the
incremental allocator keeps preempting. Every invariant is checked each step and at the end
(the engine's own checks, plus the progress bound: no request is preempted more often than
it got tokens). What the run shows:

- memory: the resident set (current and peak) when the first step ends, half-way and when
  the last does; flat means the engine holds nothing per step beyond each request's own record;
- scheduling cost: steps bucketed by the waiting queue's length, with the mean seconds of the
  schedule phase per bucket, the ratio of the longest-queue bucket to the shortest, and a
  least-squares slope (seconds per 1000 waiting). Under a policy that looks only at the head
  of the queue (FCFS), a ratio near 1 means the cost does not grow with the queue.

Writes `soak.csv` (one row per bucket) and `soak.md` (summary and table) into `--out`.
Counts hold on any machine; seconds describe this one.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from experiments.toolkit import cli
from framework.core.step_stats import StepStats
from framework.engine.loop import RunResult
from framework.run.app import build_engine, load
from framework.run.compose import compose_cfg
from framework.run.in_process import threads_kept
from framework.run.paths import OUTPUTS
from framework.run.summary import summarize
from framework.tracking.tables import cell, markdown_table, write_csv
from framework.workloads import build_workload

BASE = [
    "model=tiny",
    "scheduler=continuous",
    "allocator=incremental",
    "workload=synthetic",
    "workload.prompt_len_dist=uniform",
    "workload.prompt_len_min=4",
    "workload.prompt_len_max=48",
    "workload.output_len_dist=uniform",
    "workload.output_len_min=1",
    "workload.output_len_max=32",
    "workload.arrival=poisson",
    "engine.block_size=4",
    "engine.max_num_seqs=16",
    "engine.check_invariants=true",
    # The tiny model's matrices are too small to split; one thread also keeps the timings
    # clean when other jobs share the cores (spinning thread pools collapse under contention).
    "threads=1",
]
MIN_BUCKET_STEPS = 20  # a bucket with fewer steps is too noisy to compare


def rss_mb() -> float | None:
    """Current resident set in MiB (Linux /proc; None elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    """Peak resident set so far, in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


@dataclass
class Probe:
    """The engine's hooks for the soak: samples memory as the run goes."""

    every: int = 100
    memory: list[tuple[int, float | None, float]] = field(default_factory=list)

    def on_step_end(self, stats: StepStats) -> None:
        if stats.step % self.every == 0:
            self.memory.append((stats.step, rss_mb(), peak_rss_mb()))

    def on_request_finished(self, request: Any) -> None:
        pass


def buckets(steps: list[StepStats], n: int) -> list[dict[str, Any]]:
    """Steps grouped into `n` equal-width bins of waiting-queue length, each bin's means."""
    waiting = np.array([st.waiting for st in steps])
    edges = np.linspace(0, max(int(waiting.max()), 1), n + 1)
    which = np.clip(np.searchsorted(edges, waiting, side="right") - 1, 0, n - 1)
    rows = []
    for b in range(n):
        sel = [st for st, w in zip(steps, which, strict=True) if w == b]
        if not sel:
            continue
        rows.append(
            {
                "bucket": b,
                "waiting_from": int(np.ceil(edges[b])),
                "waiting_to": int(edges[b + 1]),
                "steps": len(sel),
                "mean_waiting": float(np.mean([st.waiting for st in sel])),
                "mean_rows": float(np.mean([st.rows for st in sel])),
                "schedule_s": float(np.mean([st.phase_s.get("schedule", 0.0) for st in sel])),
                "allocate_s": float(np.mean([st.phase_s.get("allocate", 0.0) for st in sel])),
                "step_s": float(np.mean([sum(st.phase_s.values()) for st in sel])),
            }
        )
    return rows


def check_progress(result: RunResult) -> None:
    """The invariants beyond the engine's own: every request accounted for, and no request
    preempted more often than it got tokens (each admission yields one before the next)."""
    s = summarize(result)
    if s["requests_finished"] + s["requests_rejected"] != s["requests"]:
        raise AssertionError(f"unfinished requests: {s}")
    for seq in result.seqs:
        if seq.preemptions > max(0, len(seq.output_token_ids) - 1):
            raise AssertionError(
                f"{seq.id} preempted {seq.preemptions} times for {len(seq.output_token_ids)} "
                "tokens: no progress guarantee"
            )
    if s["deferred_tokens"] != s["tokens_kept"] + s["overshoot_tokens"]:
        raise AssertionError("token conservation broken")


def soak(
    requests: int, rate: float, num_blocks: int, num_buckets: int, overrides: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    over = [
        *BASE,
        f"workload.num_requests={requests}",
        f"workload.rate={rate}",
        f"engine.num_blocks={num_blocks}",
        *overrides,
    ]
    cfg = compose_cfg(over)
    torch.manual_seed(cfg.seed)
    model, tok, device, dtype = load(cfg)
    specs = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), tok)
    probe = Probe(every=max(1, requests // 30))
    engine = build_engine(cfg, model, device, dtype, probe)
    with threads_kept():
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        t0 = time.perf_counter()
        result = engine.run(specs, tok.eos_token_id)  # raises on any broken invariant
        wall = time.perf_counter() - t0
    check_progress(result)
    probe.memory.append((len(result.steps), rss_mb(), peak_rss_mb()))
    table = buckets(result.steps, num_buckets)
    full = [r for r in table if r["steps"] >= MIN_BUCKET_STEPS] or table
    shortest, longest = (
        min(full, key=lambda r: r["mean_waiting"]),
        max(full, key=lambda r: r["mean_waiting"]),
    )
    waiting = np.array([st.waiting for st in result.steps], dtype=float)
    sched = np.array([st.phase_s.get("schedule", 0.0) for st in result.steps])
    slope = float(np.polyfit(waiting, sched, 1)[0]) * 1000 if np.ptp(waiting) > 0 else 0.0
    s = summarize(result)
    (_, rss_start, peak_start), (_, rss_end, peak_end) = probe.memory[0], probe.memory[-1]
    # Growth that stops is a warm-up (allocator pools, oneDNN's per-shape state); a leak
    # grows in the second half as in the first.
    _, rss_mid, _ = probe.memory[len(probe.memory) // 2]
    summary = {
        "requests": s["requests"],
        "requests_finished": s["requests_finished"],
        "requests_rejected": s["requests_rejected"],
        "steps": s["steps"],
        "tokens_kept": s["tokens_kept"],
        "preemptions": s["preemptions"],
        "max_preemptions_per_request": s["max_preemptions_per_request"],
        "num_blocks": s["num_blocks"],
        "peak_blocks": s["peak_blocks"],
        "max_waiting": int(waiting.max()),
        "invariants_held": True,  # any broken one raised above
        "rss_start_mb": rss_start,
        "rss_mid_mb": rss_mid,
        "rss_end_mb": rss_end,
        "rss_growth_second_half_mb": (
            rss_end - rss_mid if rss_end is not None and rss_mid is not None else None
        ),
        "peak_rss_start_mb": peak_start,
        "peak_rss_end_mb": peak_end,
        "schedule_s_shortest_queue": shortest["schedule_s"],
        "schedule_s_longest_queue": longest["schedule_s"],
        "schedule_ratio_longest_to_shortest": (
            longest["schedule_s"] / shortest["schedule_s"] if shortest["schedule_s"] else None
        ),
        "schedule_s_per_1000_waiting": slope,
        "wall_s": wall,
        "config": " ".join(over),
    }
    return summary, table


def write(summary: dict[str, Any], table: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(table, list(table[0]), out / "soak.csv")
    lines = ["# Soak", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {cell(v)} |" for k, v in summary.items()]
    lines += ["", markdown_table(table, list(table[0]))]
    (out / "soak.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> Path:
    ap = cli.parser(__doc__)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument(
        "--rate", type=float, default=1000.0, help="arrivals per second (far above service)"
    )
    ap.add_argument(
        "--num-blocks", type=int, default=48, help="KV pool, blocks of 4 tokens (tight)"
    )
    ap.add_argument("--buckets", type=int, default=8, help="bins of waiting-queue length")
    cli.add_out(ap, None, "the folder (default outputs/soak/DATE_TIME)")
    cli.add_overrides(ap, "Hydra overrides of the soak's config")
    args = ap.parse_args(argv)
    out = args.out or OUTPUTS / "soak" / time.strftime("%Y-%m-%d_%H-%M-%S")
    summary, table = soak(args.requests, args.rate, args.num_blocks, args.buckets, args.overrides)
    write(summary, table, out)
    for k, v in summary.items():
        print(f"{k:36s} {cell(v)}")
    print(f"results in {out}")
    return out
