"""Scale: whole traces through the simulated executor, and what the engine's own host work
costs per step as the waiting queue grows.

    python -m experiments.sim_scale                       # both Azure traces, SmolLM2's shape
    python -m experiments.sim_scale --limit 2000 --traces conv model=tiny \\
        executor.profile=llama-8b-bfloat16-h100-sxm.analytic executor.any_profile=true

Each trace is replayed whole (its real arrival times, `engine.max_num_seqs=128`) on the
virtual clock, with the invariant checks off and on, `--rounds` rounds (3) whose order
alternates (off then on, on then off, ...): a shared machine's slow spells then fall on both
sides alike, and what the checks cost is the median over rounds of the two runs' wall-time
ratio within one round, not two numbers taken minutes apart (one such pair can read the checks
as faster than none). No model is loaded and nothing sleeps, so the wall
time is the engine's own: building each step, the policies, the bookkeeping, and the cost
model's prediction. Reported per trace and setting: simulated steps, requests and virtual
makespan; the median wall time of `engine.run`, steps/s (and their range over the rounds)
and requests/s; the checks' cost; and the wall seconds per step bucketed by the waiting
queue's length, over every round (flat means the schedule does not grow with the backlog).
Every run's own row is in `sim_scale.csv`.

The host time is `model` (the profile's per-step cost on the virtual clock), so the wall
seconds measured here never feed back into the simulated schedule: every round must count
the same, which is checked. Writes `sim_scale.csv` (every run), `sim_scale_summary.csv`,
`sim_scale_buckets.csv` and `sim_scale.md` into `--out`. Steps/s describe this machine only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from experiments.toolkit import cli
from framework.run.app import build_engine, load
from framework.run.compose import compose_cfg
from framework.run.paths import TRACES
from framework.run.summary import summarize
from framework.tracking.tables import markdown_table, write_csv
from framework.tracking.tags import environment_tags
from framework.tracking.tool_run import command_line
from framework.workloads import build_workload

BASE = [
    "executor=simulated",
    "executor.host_time=model",
    "workload=trace",
    "engine.max_num_seqs=128",
    # No tensors back the simulated pool: size it for the concurrency, not for this RAM.
    "engine.kv_memory_mb=8192",
    "observers=[console]",
]


class StepTimer:
    """The engine's hooks for these runs: the wall time between consecutive step ends,
    with the waiting queue's length at each."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.rows: list[tuple[int, float]] = []

    def on_step_end(self, stats: Any) -> None:
        now = time.perf_counter()
        self.rows.append((stats.waiting, now - self.last))
        self.last = now

    def on_request_finished(self, request: Any) -> None:
        pass


def buckets(rows: list[tuple[int, float]], n: int = 8) -> list[dict[str, Any]]:
    """Mean wall seconds per step in `n` equal bands of the waiting queue's length, from
    (waiting, seconds) pairs: every step of every round of one trace and setting."""
    waiting = np.array([w for w, _ in rows], dtype=float)
    secs = np.array([s for _, s in rows], dtype=float)
    edges = np.linspace(0, max(waiting.max(), 1.0), n + 1)
    which = np.clip(np.searchsorted(edges, waiting, side="right") - 1, 0, n - 1)
    out = []
    for b in range(n):
        sel = which == b
        if sel.any():
            out.append(
                {
                    "waiting_from": int(np.ceil(edges[b])),
                    "waiting_to": int(edges[b + 1]),
                    "steps": int(sel.sum()),
                    "wall_ms_per_step": 1e3 * float(secs[sel].mean()),
                }
            )
    return out


def run_one(cfg: Any, loaded: tuple[Any, ...], specs: list[Any]) -> tuple[dict[str, Any], Any]:
    model, tokenizer, device, dtype = loaded
    timer = StepTimer()
    engine = build_engine(cfg, model, device, dtype, timer)
    t0 = time.perf_counter()
    timer.last = t0
    result = engine.run(specs, tokenizer.eos_token_id)
    wall = time.perf_counter() - t0
    s = summarize(result)
    row = {
        "requests": s["requests"],
        "finished": s["requests_finished"],
        "rejected": s["requests_rejected"],
        "steps": s["steps"],
        "preemptions": s["preemptions"],
        "simulated_makespan_s": s["makespan_s"],
        "wall_s": wall,
        "steps_per_s": s["steps"] / wall if wall else 0.0,
        "requests_per_s": s["requests"] / wall if wall else 0.0,
    }
    return row, timer


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace and setting over its rounds: the counts (the same in every round: the
    virtual clock does not see the wall), the median wall time and rates, the range."""
    rates = [r["steps_per_s"] for r in runs]
    first = runs[0]
    keep = ("trace", "invariants", "requests", "finished", "rejected", "steps", "preemptions")
    counted = [(*(r[k] for k in keep), r["simulated_makespan_s"]) for r in runs]
    if len(set(counted)) > 1:
        raise RuntimeError(f"the rounds of one setting counted differently: {counted}")
    return {
        **{k: first[k] for k in keep},
        "simulated_makespan_s": first["simulated_makespan_s"],
        "rounds": len(runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "steps_per_s": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "requests_per_s": statistics.median(r["requests_per_s"] for r in runs),
    }


def checks_cost(runs: list[dict[str, Any]]) -> tuple[float, float, float]:
    """The invariant checks' cost on one trace: each round's wall time with them over
    without them, less one; (the median over rounds, the smallest, the largest)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["invariants"]] = r["wall_s"]
    ratios = [w["on"] / w["off"] - 1 for w in by_round.values() if len(w) == 2 and w["off"]]
    return statistics.median(ratios), min(ratios), max(ratios)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__)
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    ap.add_argument("--limit", type=int, default=None, help="requests per trace (all)")
    cli.add_rounds(ap, 3, "rounds of off and on, alternating (3)")
    cli.add_out(ap, Path("outputs/sim_scale"))
    cli.add_overrides(ap, "Hydra overrides (model=..., executor.*)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    limit = "null" if args.limit is None else str(args.limit)
    rows: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    bucket_rows: list[dict[str, Any]] = []
    costs: list[str] = []
    loaded = None
    for trace in args.traces:
        path = TRACES[trace]
        if not path.is_file():
            sys.exit(f"error: {path}: no such trace (the Azure traces live in ../shared)")
        over = [*BASE, f"workload.path={path}", f"workload.limit={limit}", *args.overrides]
        cfg = compose_cfg(over)
        loaded = loaded or load(cfg)
        t0 = time.perf_counter()
        specs = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), loaded[1])
        built_s = time.perf_counter() - t0
        cfgs = {
            checks: compose_cfg([*over, f"engine.check_invariants={checks}"])
            for checks in ("false", "true")
        }
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        steps: dict[str, list[tuple[int, float]]] = {"off": [], "on": []}
        for k in range(args.rounds):
            for checks in ("false", "true") if k % 2 == 0 else ("true", "false"):
                row, timer = run_one(cfgs[checks], loaded, specs)
                side = "on" if checks == "true" else "off"
                row = {"trace": trace, "invariants": side, **row, "round": k + 1}
                row["workload_build_s"] = built_s
                runs[side].append(row)
                steps[side] += timer.rows
                print(
                    f"{trace} invariants {side}, round {k + 1}/{args.rounds}: "
                    f"{row['steps']} steps, {row['requests']} requests in {row['wall_s']:.1f} s "
                    f"wall = {row['steps_per_s']:.0f} steps/s, {row['requests_per_s']:.0f} "
                    f"requests/s; simulated makespan {row['simulated_makespan_s']:.0f} s",
                    flush=True,
                )
        for side in ("off", "on"):
            rows += runs[side]
            summaries.append(summary(runs[side]))
            bucket_rows += [{"trace": trace, "invariants": side, **b} for b in buckets(steps[side])]
        mid, low, high = checks_cost(runs["off"] + runs["on"])
        costs.append(
            f"- {trace}: the invariant checks add {mid:+.1%} to the wall time (median of "
            f"{args.rounds} rounds; {low:+.1%} to {high:+.1%})"
        )
        print(costs[-1][2:], flush=True)
    tags = environment_tags()
    write_csv(rows, list(rows[0]), args.out / "sim_scale.csv")
    write_csv(summaries, list(summaries[0]), args.out / "sim_scale_summary.csv")
    write_csv(bucket_rows, list(bucket_rows[0]), args.out / "sim_scale_buckets.csv")
    text = [
        "# Simulated executor at trace scale",
        "",
        f"`{command_line('sim_scale', argv)}`"
        f" on {tags.get('machine.cpu')} ({tags.get('machine.cores')} cores), commit "
        f"{tags.get('git.commit', '?')[:10]}. Steps/s and wall seconds describe this machine.",
        "",
        f"Medians over {args.rounds} rounds (steps/s: the range beside):",
        "",
        markdown_table(summaries, list(summaries[0])),
        "",
        *costs,
        "",
        "Every run:",
        "",
        markdown_table(rows, list(rows[0])),
        "",
        "Wall milliseconds per step by the waiting queue's length:",
        "",
        markdown_table(bucket_rows, list(bucket_rows[0])),
        "",
    ]
    (args.out / "sim_scale.md").write_text("\n".join(text))
    print(f"wrote {args.out / 'sim_scale.md'}")
