"""Speed before and after a change: the simulator's steps/s and a real model's tokens/s at a git
ref and in the working tree, in alternating processes, as ratios.

    python -m experiments.same_speed --base HEAD                  # the working tree against HEAD
    python -m experiments.same_speed --base main~3 --rounds 7 --cases sim_conv

A restructuring must not slow what users measure with. Each case is one process per tree and
round (`python -m experiments.bench.same_speed --one CASE --tree TREE`), run with this tree's
interpreter against the code of `TREE`, in rounds whose order alternates (base then here, here
then base, ...) so that a shared machine's slow spells fall on both sides alike; nothing else
should run meanwhile. The cases:
- `sim_conv`: the Azure conversation trace's first 4,000 requests on the simulator (SmolLM2's
  shape, `executor.host_time=model`, invariant checks off): steps/s of `engine.run`;
- `sim_prefix`: the Mooncake conversation trace's first 1,500 requests on the prefix cache;
- `model_chat`: SmolLM2 on the 16 chat prompts, its kernels fixed (none chosen by timing, which
  would differ between processes), four runs after one warm-up: tokens/s of `engine.run`.
A process also reports its run's counts, which must agree between the trees. Writes
`same_speed.csv` (every process) and `same_speed.md` (each case's median ratio here/base and
its range); the ratios describe this machine only.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.bench.same_behaviour import drop_worktree, worktree
from experiments.toolkit import cli
from framework.run.paths import OUTPUTS, ROOT
from framework.tracking.tool_run import command_line

TRACES = ROOT.parent / "shared" / "data" / "traces"
SIM = [
    "executor=simulated",
    "executor.host_time=model",
    "engine.max_num_seqs=128",
    "engine.kv_memory_mb=8192",
    "engine.check_invariants=false",
]
# Each case: its overrides, the rate it reports, the runs it times (after a warm-up when > 1).
CASES: dict[str, tuple[list[str], str, int]] = {
    "sim_conv": (
        [*SIM, "workload=trace", f"workload.path={TRACES / 'azure_llm_2023_conv.csv'}",
         "workload.limit=4000"],
        "steps_per_s", 1,
    ),
    "sim_prefix": (
        [*SIM, "workload=mooncake", f"workload.path={TRACES / 'mooncake_conversation.jsonl'}",
         "workload.limit=1500", "allocator=prefix_cache", "engine.block_size=16"],
        "steps_per_s", 1,
    ),
    "model_chat": (
        ["workload=chat", "engine.check_invariants=false", "engine.packed_linears=true",
         "engine.paged_kernel=true", "engine.argmax_kernel=true", "engine.small_linear=true",
         "engine.layer_glue=true"],
        "tokens_per_s", 4,
    ),
}  # fmt: skip


class _Quiet:
    def on_step_end(self, stats: Any) -> None:
        pass

    def on_request_finished(self, request: Any) -> None:
        pass


def one(case: str, tree: Path, extra: list[str]) -> dict[str, Any]:
    """In this process, `tree`'s code: the case's rate and counts. Only what every tree has
    is used (Hydra's compose API, `build_engine`, `load`, `build_workload`, `summarize`)."""
    sys.path.insert(0, str(tree))
    for name in [m for m in sys.modules if m == "framework" or m.startswith("framework.")]:
        del sys.modules[name]  # this tree's framework, not the one that parsed the arguments
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from framework.run.app import build_engine, load
    from framework.run.config import register_configs
    from framework.run.summary import summarize
    from framework.workloads import build_workload

    overrides, rate, runs = CASES[case]
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(tree / "conf")):
        cfg = compose(config_name="config", overrides=[*overrides, "observers=[]", *extra])
    model, tokenizer, device, dtype = load(cfg)
    specs = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), tokenizer)
    if runs > 1:  # kernels built and caches warm before the timed runs
        build_engine(cfg, model, device, dtype, _Quiet()).run(specs, tokenizer.eos_token_id)
    wall = 0.0
    for _ in range(runs):
        engine = build_engine(cfg, model, device, dtype, _Quiet(), False)
        t = time.perf_counter()
        result = engine.run(specs, tokenizer.eos_token_id)
        wall += time.perf_counter() - t
    s = summarize(result)
    per_run = wall / runs
    value = s["steps"] / per_run if rate == "steps_per_s" else s["tokens_kept"] / per_run
    return {rate: value, "steps": s["steps"], "tokens_kept": s["tokens_kept"]}


def spawn(case: str, tree: Path, extra: list[str]) -> dict[str, Any]:
    """One case in a fresh process over `tree`'s code."""
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench.same_speed", "--one", case, "--tree", str(tree),
         *extra],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"{case} at {tree}: exit {proc.returncode}: {' '.join(tail)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(ref: str, cases: list[str], rounds: int, extra: list[str]) -> list[dict[str, Any]]:
    """Every process's row: case, round, side, rate and counts."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = worktree(ref, Path(tmp))
        try:
            for r in range(rounds):
                order = [("base", base), ("here", ROOT)]
                for side, tree in order if r % 2 == 0 else order[::-1]:
                    for case in cases:
                        got = spawn(case, tree, extra)
                        rows.append({"case": case, "round": r, "side": side, **got})
                        print(f"round {r} {side} {case}: {got}", flush=True)
        finally:
            drop_worktree(base)
    return rows


def summary(rows: list[dict[str, Any]], case: str) -> dict[str, Any]:
    """A case's ratios here/base, one per round, and whether both trees counted alike."""
    rate = CASES[case][1]
    mine = [r for r in rows if r["case"] == case]
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in mine:
        by_round.setdefault(r["round"], {})[r["side"]] = r
    ratios = [s["here"][rate] / s["base"][rate] for s in by_round.values() if len(s) == 2]
    counts = {(r["steps"], r["tokens_kept"]) for r in mine}
    return {
        "case": case,
        "rate": rate,
        "median": statistics.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
        "same_counts": len(counts) == 1,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = cli.parser(__doc__)
    ap.add_argument("--base", default="HEAD", help="git ref to compare against (HEAD)")
    ap.add_argument(
        "--cases", type=cli.comma_list(CASES), default=list(CASES), help="a subset, by name"
    )
    cli.add_rounds(ap, 5, "alternating rounds (5)")
    cli.add_out(ap, OUTPUTS / "same_speed")
    ap.add_argument("--one", choices=list(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    cli.add_overrides(ap, "Hydra overrides for every case (model=tiny for a quick try)")
    args = ap.parse_args(argv)
    if args.one:  # a child process: one case over one tree's code
        print(json.dumps(one(args.one, args.tree.resolve(), args.overrides)))
        return []
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = compare(args.base, args.cases, args.rounds, args.overrides)
    with (out / "same_speed.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    found = [summary(rows, case) for case in args.cases]
    lines = [
        "# nanoserve: the same speed",
        "",
        f"- command: `{command_line('same_speed', argv)}`",
        f"- base: `{args.base}` against the working tree; {args.rounds} alternating rounds",
        "",
        "| case | rate | here / base (median) | range | same counts |",
        "|---|---|---|---|---|",
        *[
            f"| {s['case']} | {s['rate']} | {s['median']:.3f} | {s['low']:.3f}-{s['high']:.3f}"
            f" | {'yes' if s['same_counts'] else 'no'} |"
            for s in found
        ],
    ]
    (out / "same_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[5:]))
    return found


if __name__ == "__main__":
    main()
