"""Scale: whole traces through the simulated executor, and what the engine's own host work
costs per step as the waiting queue grows.

    python -m experiments.sim_scale                       # both Azure traces, SmolLM2's shape
    python -m experiments.sim_scale --limit 2000 --traces conv model=tiny \\
        executor.profile=llama-8b-bfloat16-h100-sxm.analytic executor.any_profile=true

Each trace is replayed whole (its real arrival times, `engine.max_num_seqs=128`) on the
virtual clock, with the invariant checks off and then on. No model is loaded and nothing
sleeps, so the wall time is the engine's own: building each step, the policies, the
bookkeeping, and the cost model's prediction. Reported per run: simulated steps, requests
and virtual makespan; the wall time of `engine.run`, steps/s and requests/s; and the wall
seconds per step bucketed by the waiting queue's length (flat means the schedule does not
grow with the backlog).

The host time is `model` (the profile's per-step cost on the virtual clock), so the wall
seconds measured here never feed back into the simulated schedule. Writes `sim_scale.csv`,
`sim_scale_buckets.csv` and `sim_scale.md` into `--out`. Steps/s describe this machine only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from experiments.window_sweep import compose_cfg
from framework.run.app import build_engine, load
from framework.run.summary import summarize
from framework.tracking.tables import markdown_table, write_csv
from framework.tracking.tags import environment_tags
from framework.workloads import build_workload

ROOT = Path(__file__).resolve().parents[1]
TRACES = {
    "conv": ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv",
    "code": ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_code.csv",
}
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


def buckets(timer: StepTimer, n: int = 8) -> list[dict[str, Any]]:
    waiting = np.array([w for w, _ in timer.rows], dtype=float)
    secs = np.array([s for _, s in timer.rows], dtype=float)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--limit", type=int, default=None, help="requests per trace (all)")
    parser.add_argument("--out", type=Path, default=Path("outputs/sim_scale"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (model=..., executor.*)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    limit = "null" if args.limit is None else str(args.limit)
    rows, bucket_rows = [], []
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
        for checks in (False, True):
            cfg = compose_cfg([*over, f"engine.check_invariants={str(checks).lower()}"])
            row, timer = run_one(cfg, loaded, specs)
            row = {"trace": trace, "invariants": "on" if checks else "off", **row}
            row["workload_build_s"] = built_s
            rows.append(row)
            bucket_rows += [
                {"trace": trace, "invariants": row["invariants"], **b} for b in buckets(timer)
            ]
            print(
                f"{trace} invariants {row['invariants']}: {row['steps']} steps, "
                f"{row['requests']} requests in {row['wall_s']:.1f} s wall = "
                f"{row['steps_per_s']:.0f} steps/s, {row['requests_per_s']:.0f} requests/s; "
                f"simulated makespan {row['simulated_makespan_s']:.0f} s",
                flush=True,
            )
    tags = environment_tags()
    write_csv(rows, list(rows[0]), args.out / "sim_scale.csv")
    write_csv(bucket_rows, list(bucket_rows[0]), args.out / "sim_scale_buckets.csv")
    text = [
        "# Simulated executor at trace scale",
        "",
        f"`python -m experiments.sim_scale {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f" on {tags.get('machine.cpu')} ({tags.get('machine.cores')} cores), commit "
        f"{tags.get('git.commit', '?')[:10]}. Steps/s and wall seconds describe this machine.",
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


if __name__ == "__main__":
    main()
