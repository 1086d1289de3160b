"""A batch-size sweep as llama.cpp's `llama-batched-bench` makes one: at each batch size B, B
requests of one prompt length (PP) each generate TG tokens; prompt processing and text
generation are timed apart, and their speeds reported.

    python -m experiments.benchmark --batch-sweep 1,2,4,8,16,32,64 --sweep-prompt 128 \\
        --sweep-gen 32 [--llama-batched-bench BIN --gguf MODEL.gguf]

For nanoserve, B requests queued at once, `engine.max_num_seqs` = B and room for every
prompt in one step, run by the engine (run.py's path, no server), greedy with EOS ignored.
A row's prompt seconds are its steps that compute prompt tokens (the first token of each
request is sampled there, as in llama.cpp's prompt pass); its generation seconds are the TG
steps that follow, decode rows alone, so TG tokens = B x TG, as `llama-batched-bench`
counts them (`S_TG = B * TG / T_TG`). Step seconds are the differences of the steps' end
times (`StepStats.time`).

For llama.cpp, `llama-batched-bench -npp PP -ntg TG -npl B,...` (prompts not shared) with the
same threads, its markdown table read back (`parse_batched_bench`). The two alternate batch
size by batch size, each round, and the median over rounds is reported. Nothing here is
simulated: both are this machine's seconds, under its load at the time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.bench.llamacpp import KV_TYPES
from experiments.bench.systems import run_nanoserve
from experiments.toolkit.config import REFERENCE
from experiments.toolkit.engine import Context
from experiments.toolkit.workloads import fixed_specs
from framework.core.step_stats import StepStats
from framework.run.app import load
from framework.run.compose import compose_cfg
from framework.tracking.machine import isa_summary
from framework.tracking.tags import environment_tags


@dataclass(frozen=True)
class SweepPoint:
    """One system at one batch size: seconds of prompt processing and of generation."""

    system: str
    batch: int
    prompt: int
    gen: int
    pp_s: float
    tg_s: float

    @property
    def pp_tps(self) -> float:
        return self.batch * self.prompt / self.pp_s if self.pp_s > 0 else float("nan")

    @property
    def tg_tps(self) -> float:
        return self.batch * self.gen / self.tg_s if self.tg_s > 0 else float("nan")

    def row(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "pp_tps": self.pp_tps, "tg_tps": self.tg_tps}


def phase_seconds(steps: list[StepStats], gen: int) -> tuple[float, float]:
    """(prompt seconds, generation seconds) of one sweep run's steps: the steps that compute
    prompt tokens, then the first `gen` steps of decode rows alone after them."""
    pp = tg = 0.0
    decodes = 0
    before = 0.0
    for step in steps:
        took = step.time - before
        before = step.time
        if step.prefill_tokens:
            if decodes:
                raise ValueError("a sweep run computed prompt tokens after its generation began")
            pp += took
        elif decodes < gen:
            tg += took
            decodes += 1
    if decodes < gen:
        raise ValueError(f"a sweep run made {decodes} generation steps of {gen}")
    return pp, tg


def nanoserve_point(ctx: Context, batch: int, prompt: int, gen: int) -> SweepPoint:
    """B requests of `prompt` tokens, each generating 1 + `gen` (its first in the prompt
    step), all at once: every row in every step."""
    specs = fixed_specs(ctx.tok, [prompt] * batch, [gen + 1] * batch, ctx.cfg.seed)
    e = ctx.cfg.engine
    per_row = -(-(prompt + gen + 1) // e.block_size)
    room = [
        f"engine.max_num_seqs={batch}",
        f"engine.num_blocks={batch * per_row + 1}",
        f"engine.max_num_batched_tokens={max(batch * prompt, e.max_num_batched_tokens)}",
    ]
    wide = dataclasses.replace(ctx, overrides=[*ctx.overrides, *room])
    served = run_nanoserve(wide, REFERENCE, specs)
    if any(len(out) != gen + 1 for out in served.outputs.values()):
        raise ValueError("a sweep request stopped before its length")
    pp, tg = phase_seconds(served.steps, gen)
    return SweepPoint("nanoserve", batch, prompt, gen, pp, tg)


# ---- llama.cpp's llama-batched-bench ------------------------------------------------------


def batched_bench_command(
    binary: Path, gguf: Path, batches: list[int], prompt: int, gen: int, threads: int
) -> list[str]:
    """`llama-batched-bench` over the sweep's batch sizes, prompts not shared, its context
    room for the largest batch, every prompt in one batch (`-b`), on `threads` threads; the
    KV cache in the weights' dtype where the file's name says F32 or BF16, as nanoserve's
    (`KV_TYPES`; else llama.cpp's default, f16)."""
    ctx = max(batches) * (prompt + gen) + 16
    kind = next((k for k in KV_TYPES if gguf.name.upper().endswith(f"-{k}.GGUF")), None)
    kv = ["-ctk", KV_TYPES[kind], "-ctv", KV_TYPES[kind]] if kind else []
    return [
        str(binary), "-m", str(gguf), "-c", str(ctx), "-b", str(max(2048, max(batches) * prompt)),
        "-ub", "512", "-npp", str(prompt), "-ntg", str(gen), "-npl", ",".join(map(str, batches)),
        "-t", str(threads), "-tb", str(threads), *kv,
    ]  # fmt: skip


_ROW = re.compile(r"^\|\s*\d+\s*\|")


def parse_batched_bench(text: str, system: str = "llama.cpp") -> list[SweepPoint]:
    """The rows of `llama-batched-bench`'s markdown table: | PP | TG | B | N_KV | T_PP s |
    S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |."""
    points = []
    for line in text.splitlines():
        if not _ROW.match(line.strip()):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8:
            continue
        pp, tg, b = int(cells[0]), int(cells[1]), int(cells[2])
        points.append(SweepPoint(system, b, pp, tg, float(cells[4]), float(cells[6])))
    if not points:
        raise ValueError(f"no rows in llama-batched-bench's output:\n{text[-2000:]}")
    return points


def llamacpp_point(
    binary: Path, gguf: Path, batch: int, prompt: int, gen: int, threads: int, timeout_s: float
) -> SweepPoint:
    """One batch size through `llama-batched-bench` (one process a point, so the two systems
    can alternate point by point)."""
    cmd = batched_bench_command(binary, gguf, [batch], prompt, gen, threads)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    (point,) = parse_batched_bench(done.stdout + "\n" + done.stderr)
    return point


# ---- the sweep ------------------------------------------------------------------------------


def sweep(
    ctx: Context,
    batches: list[int],
    prompt: int,
    gen: int,
    rounds: int,
    llama: tuple[Path, Path] | None,
    threads: int,
    timeout_s: float = 1800.0,
) -> list[dict[str, Any]]:
    """Each batch size through each system, alternating, `rounds` times; one row per
    (system, batch): the medians, and llama.cpp's speed over nanoserve's where it ran."""
    seen: dict[tuple[str, int], list[SweepPoint]] = {}
    nanoserve_point(ctx, 1, min(prompt, 8), 2)  # first calls, outside any clock
    for _ in range(rounds):
        for b in batches:
            points = [nanoserve_point(ctx, b, prompt, gen)]
            if llama is not None:
                points.append(llamacpp_point(*llama, b, prompt, gen, threads, timeout_s))
            for p in points:
                seen.setdefault((p.system, b), []).append(p)
    rows = []
    for (system, b), points in seen.items():
        pp = statistics.median(p.pp_s for p in points)
        tg = statistics.median(p.tg_s for p in points)
        rows.append({**SweepPoint(system, b, prompt, gen, pp, tg).row(), "rounds": len(points)})
    by = {(r["system"], r["batch"]): r for r in rows}
    for r in rows:
        mine = by.get(("nanoserve", r["batch"]))
        r["tg_vs_nanoserve"] = r["tg_tps"] / mine["tg_tps"] if mine else float("nan")
    return sorted(rows, key=lambda r: (r["batch"], r["system"] != "nanoserve"))


def table(rows: list[dict[str, Any]], header: dict[str, str]) -> str:
    lines = [f"- {k}: {v}" for k, v in header.items()]
    lines += [
        "",
        "| system | B | PP | TG | T_PP s | S_PP t/s | T_TG s | S_TG t/s | S_TG / nanoserve's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['system']} | {r['batch']} | {r['prompt']} | {r['gen']} | {r['pp_s']:.3f} | "
            f"{r['pp_tps']:.1f} | {r['tg_s']:.3f} | {r['tg_tps']:.1f} | "
            f"{r['tg_vs_nanoserve']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def run_sweep(args: argparse.Namespace, dtypes: list[str], overrides: list[str]) -> Path:
    """`--batch-sweep`: the sweep in each dtype (llama.cpp's GGUF given per run: its dtype is
    the file's), written to `batch_sweep.md` and `batch_sweep.json` in `--out`."""
    llama = None
    if args.llama_batched_bench:
        if not args.gguf:
            raise SystemExit("--llama-batched-bench needs --gguf (the model file it runs)")
        llama = (Path(args.llama_batched_bench), Path(args.gguf))
    load_start = os.getloadavg()[0]
    threads = torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    for dt in dtypes:
        over = [*(o for o in overrides if not o.startswith("dtype=")), f"dtype={dt}"]
        cfg = compose_cfg(over)
        model, tok, device, dtype = load(cfg)
        ctx = Context(cfg, over, model, tok, device, dtype)
        for row in sweep(ctx, args.batch_sweep, args.sweep_prompt, args.sweep_gen,
                         args.rounds, llama, threads):  # fmt: skip
            rows.append({**row, "dtype": dt if row["system"] == "nanoserve" else str(args.gguf)})
    header = {
        "machine": f"{environment_tags()['machine.cpu']}, {os.cpu_count()} cores, ISA "
        f"{isa_summary()}; load average {load_start:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end",
        "threads": str(threads),
        "nanoserve": f"{compose_cfg(overrides).model.source}, the engine (run.py's path), "
        f"dtypes {', '.join(dtypes)}",
        "llama.cpp": f"{llama[0]} on {llama[1]}" if llama else "(not run: --llama-batched-bench)",
        "rounds": f"{args.rounds}, alternating batch by batch; medians",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch_sweep.json").write_text(
        json.dumps({"header": header, "rows": rows}, indent=1)
    )
    md = args.out / "batch_sweep.md"
    md.write_text(table(rows, header))
    print(md.read_text())
    return args.out
