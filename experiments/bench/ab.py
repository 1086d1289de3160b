"""A/B: two engine settings on the same workload, in alternating rounds, as one ratio.

    python -m experiments.ab --a engine.paged_kernel=true --b engine.paged_kernel=false
    python -m experiments.ab --a engine.packed_linears=false --rounds 7 workload=straggler
    python -m experiments.ab --b engine.block_size=32 --quick          # tiny model, seconds
    python -m experiments.ab --observers [--fresh-store]    # what the default observers cost

`--observers` is a preset of whole `python run.py` processes: the default observers against
`observers=[console]` (`experiments/bench/observers_ab.py`). Everything below is about the
in-process A/B of two engine settings.

On a shared or virtual machine the same run moves from one minute to the next by more than most
engine changes are worth. Two runs taken far apart, or two processes, then measure the machine
rather than the change. Here both settings serve the same requests on one loaded model, in one
process, in rounds that alternate which goes first (A B, B A, A B ...), after one untimed run of
each (kernels built, allocator and oneDNN caches warm). Each round gives a ratio B/A of wall
times taken minutes or less apart; the median of those ratios and their spread are the result. A
spread that straddles 1 says the change is below this machine's noise.

A and B must serve the same work: the same model, dtype, device and workload (the overrides
may differ anywhere else, e.g. `engine.*`, `scheduler=...`, `output=...`), and their tokens
must agree (exactly, or up to a genuine greedy tie, `framework/run/greedy_check.py`) before any
time is reported. Writes `ab.csv` (one row per run) and `ab.md`; logged to MLflow.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.bench import observers_ab
from experiments.bench.probe import decode_steps
from experiments.toolkit import cli
from experiments.toolkit.config import TIMED
from experiments.toolkit.report import write_rounded_csv
from framework.core.request import RequestSpec
from framework.run.app import build_engine, load
from framework.run.compose import compose_cfg
from framework.run.greedy_check import compare_greedy
from framework.run.in_process import NullHooks, threads_kept
from framework.run.paths import OUTPUTS
from framework.tracking.tool_run import command_line, log_run
from framework.workloads import build_workload

SHARED = ("model", "dtype", "device", "workload")  # what A and B must have in common
COLUMNS = ("round", "setting", "wall_s", "tokens_per_s", "decode_forward_s", "steps")


def check_same_work(a: DictConfig, b: DictConfig) -> None:
    """A and B differ somewhere, and nowhere that would change the model or the requests."""

    def plain(cfg: DictConfig, key: str) -> Any:
        value = cfg.get(key)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    for key in SHARED:
        left, right = plain(a, key), plain(b, key)
        if left != right:
            raise ValueError(
                f"--a and --b must serve the same work: they differ in {key!r} "
                f"({left} vs {right}); put such an override among the shared ones"
            )
    if OmegaConf.to_container(a, resolve=True) == OmegaConf.to_container(b, resolve=True):
        raise ValueError("--a and --b compose to the same config: nothing to compare")


def first_difference(
    model: Any, specs: list[RequestSpec], a: dict[str, list[int]], b: dict[str, list[int]]
) -> str | None:
    """None when B's tokens equal A's for every request (greedy ones up to a genuine tie),
    else what differs first."""
    for s in specs:
        left, right = a.get(s.id), b.get(s.id)
        if left == right:
            continue
        if left is None or right is None:
            return f"{s.id}: no output from {'A' if left is None else 'B'}"
        if s.sampling.temperature > 0:
            return f"{s.id}: sampled tokens differ ({left[:8]}... vs {right[:8]}...)"
        got = compare_greedy(model, s.prompt_token_ids, s.id, right, left)
        if not got.equal:
            return got.reason
    return None


def serve_once(
    cfg: DictConfig, loaded: tuple[Any, ...], specs: list[RequestSpec]
) -> dict[str, Any]:
    model, tok, device, dtype = loaded
    engine = build_engine(cfg, model, device, dtype, NullHooks())
    t = time.perf_counter()
    result = engine.run(specs, tok.eos_token_id)
    wall = time.perf_counter() - t
    tokens = sum(len(s.output_token_ids) for s in result.seqs)
    decode = [st.phase_s.get("forward", 0.0) for st in decode_steps(result.steps)]
    return {
        "outputs": {s.id: list(s.output_token_ids) for s in result.seqs},
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "decode_forward_s": statistics.median(decode) if decode else None,
        "steps": len(result.steps),
    }


def compare(
    shared: list[str], a: list[str], b: list[str], rounds: int
) -> tuple[list[dict[str, Any]], DictConfig]:
    """Rows of the timed runs (round, setting, times), after the untimed pair and the
    output check. Raises ValueError when A and B are not the same work."""
    cfgs = {"A": compose_cfg([*shared, *a]), "B": compose_cfg([*shared, *b])}
    check_same_work(cfgs["A"], cfgs["B"])
    loaded = load(cfgs["A"])
    specs = build_workload(OmegaConf.to_container(cfgs["A"].workload, resolve=True), loaded[1])
    warm = {k: serve_once(cfg, loaded, specs) for k, cfg in cfgs.items()}
    diff = first_difference(loaded[0], specs, warm["A"]["outputs"], warm["B"]["outputs"])
    if diff is not None:
        raise ValueError(f"A and B produced different tokens, so no time is compared: {diff}")
    rows = []
    for r in range(1, rounds + 1):
        for k in ("A", "B") if r % 2 else ("B", "A"):
            got = serve_once(cfgs[k], loaded, specs)
            if got["outputs"] != warm[k]["outputs"]:
                raise ValueError(f"round {r}: {k}'s tokens changed from its first run")
            del got["outputs"]
            rows.append({"round": r, "setting": k, **got})
    return rows, cfgs["A"]


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of each setting, and of the per-round ratios B/A (with their range)."""
    wall = {k: {r["round"]: r["wall_s"] for r in rows if r["setting"] == k} for k in "AB"}
    ratios = [wall["B"][n] / wall["A"][n] for n in wall["A"]]
    out = {
        "a_wall_s": statistics.median(wall["A"].values()),
        "b_wall_s": statistics.median(wall["B"].values()),
        "ratio_b_over_a": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    for k in "AB":
        steps = [r["decode_forward_s"] for r in rows if r["setting"] == k and r["decode_forward_s"]]
        if steps:
            out[f"{k.lower()}_decode_forward_s"] = statistics.median(steps)
    return out


def write(
    out: Path, rows: list[dict[str, Any]], stats: dict[str, float], header: dict[str, str]
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "ab.csv", out / "ab.md"
    write_rounded_csv(csv_path, COLUMNS, rows)
    ratio = stats["ratio_b_over_a"]
    verdict = (
        "within this machine's noise (the rounds' ratios straddle 1)"
        if stats["ratio_min"] <= 1 <= stats["ratio_max"]
        else ("B is slower" if ratio > 1 else "B is faster") + " in every round"
    )
    lines = ["# nanoserve A/B", "", *[f"- {k}: {v}" for k, v in header.items()], ""]
    lines += [
        f"B/A wall time: **{ratio:.3f}** (median of {len(rows) // 2} rounds; "
        f"range {stats['ratio_min']:.3f}-{stats['ratio_max']:.3f}): {verdict}.",
        "",
        "| round | A wall s | B wall s | B/A | A decode forward ms | B decode forward ms |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r["round"], r["setting"]): r for r in rows}
    for n in sorted({r["round"] for r in rows}):
        a, b = by[(n, "A")], by[(n, "B")]
        steps = [
            f"{x['decode_forward_s'] * 1e3:.1f}" if x["decode_forward_s"] else "" for x in (a, b)
        ]
        lines.append(
            f"| {n} | {a['wall_s']:.3f} | {b['wall_s']:.3f} | {b['wall_s'] / a['wall_s']:.3f} "
            f"| {steps[0]} | {steps[1]} |"
        )
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__)
    ap.add_argument("--a", action="append", default=[], help="an override of A (repeatable)")
    ap.add_argument("--b", action="append", default=[], help="an override of B (repeatable)")
    cli.add_rounds(ap, 5, "timed rounds (5)")
    cli.add_quick(ap)
    cli.add_out(ap, OUTPUTS / "ab")
    observers_ab.add_arguments(ap)
    cli.add_overrides(ap, "Hydra overrides shared by A and B")
    args = ap.parse_args(argv)
    if args.observers and (args.a or args.b):
        ap.error("--observers compares the observers: it takes no --a or --b")
    if args.fresh_store and not args.observers:
        ap.error("--fresh-store goes with --observers")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    shared = cli.run_overrides(args, TIMED)
    command = command_line("ab", argv)
    if args.observers:
        if args.out == OUTPUTS / "ab":
            args.out = OUTPUTS / "observers_ab"
        try:
            return observers_ab.main(args, shared, command).parent
        except (ValueError, RuntimeError) as err:
            sys.exit(f"experiments.ab: {err}")
    with threads_kept() as threads:
        torch.set_num_threads(compose_cfg(shared).threads or threads)
        try:
            rows, cfg = compare(shared, args.a, args.b, args.rounds)
        except ValueError as err:
            sys.exit(f"experiments.ab: {err}")
    stats = summary(rows)
    header = {
        "command": f"`{command}`",
        "A": " ".join(args.a) or "(the shared config)",
        "B": " ".join(args.b) or "(the shared config)",
        "shared": " ".join(shared),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    files = write(args.out, rows, stats, header)
    print(files[1].read_text())
    log_run(cfg, args, files, stats, tool="ab")
    return args.out
