"""Benchmark: the same workload through nanoserve and Hugging Face's own serving paths.

    python -m experiments.benchmark                            # SmolLM2, every combination
    python -m experiments.benchmark --quick --out /tmp/bench   # tiny model, a minute or less
    python -m experiments.benchmark --requests 16 --peers hf_cb --workloads azure_closed \\
        --schedulers continuous,static engine.max_num_seqs=8

Systems: nanoserve for each scheduler x allocator x output policy; `hf_static`
(`model.generate` on left-padded static batches) and `hf_cb` (transformers' continuous
batching), see `experiments/peers.py`. All greedy, EOS ignored (every request generates
exactly its length), one loaded model, one dtype, one thread count, one process.

Workloads: `straggler` (the preset: seven short requests and one long, all queued);
`azure_closed`, the first `--requests` rows of the Azure conversation trace with their lengths
scaled to `--max-prompt` / `--max-output` (`--fit clamp` clamps instead), all queued at t=0;
`azure_open`, the same requests arriving as a seeded Poisson process at `--load` (0.9) times
the capacity measured on the queued slice (the requests/s of nanoserve's reference run).

Before any time is reported, each system's tokens are compared with those of nanoserve's
reference run (continuous + incremental + immediate) under the tie rule of
`framework/run/greedy_check.py`. A system that differs gets `outputs_equal=False` and no times.

How to read the results (`benchmark.csv`, `benchmark.md` in `--out`): tokens/s and
requests/s are over the wall time from the start to the last token; TTFT is first token minus
arrival, TPOT the mean gap between a request's later tokens, both p50 / p99 over requests;
`ratio_vs_*` divide a row's tokens/s by the peer's on the same workload. The host overhead is
the share of a step that is neither the forward nor sampling, averaged over steps without a
prefill row (the executor's building of block tables counts as host work, in `build`). The
machine section compares decode steps with this machine's measured memory bandwidth and
matmul rate (see `experiments/machine_probe.py`). Seconds describe this machine only, under
its load at the time: run on a quiet machine before quoting them. Every run is logged to MLflow.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import Progress

from experiments.benchmark_report import (
    COLUMNS,
    REFERENCE,
    Pass,
    fmt,
    headline,
    is_reference,
    log_mlflow,
    write,
)
from experiments.machine_probe import (
    Probe,
    decode_steps,
    host_share,
    linears_alone_s,
    mean,
    probe,
)
from experiments.peers import Served, hf_cb, hf_static
from framework.engine.request import RequestSpec
from framework.run.app import build_engine, check_before_loading, load, resolve_device
from framework.run.config import register_configs
from framework.run.greedy_check import compare_greedy
from framework.run.summary import summarize
from framework.tracking.machine import isa_flags, isa_summary
from framework.tracking.tags import environment_tags
from framework.workloads import build_workload
from framework.workloads.synthetic import sample_arrivals
from framework.workloads.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"
PEERS = ("hf_static", "hf_cb")
WORKLOADS = ("straggler", "azure_closed", "azure_open", "chat48")
CHAT_QUEUE = 48  # chat48: the shipped chat prompts, repeated to this many, all queued
TIMES = ("wall_s", "tokens_per_s", "requests_per_s", "ttft_p50", "ttft_p99", "tpot_p50")
TIMES += ("tpot_p99", "host_overhead_share", "host_overhead_share_b8", "linear_alone_s")
# Benchmark settings under the user's overrides: invariant checks are off (they are host
# work that a serving engine would not do on every step).
BASE = ["engine.check_invariants=false"]
# Full-run sizes: the 16 nanoserve combinations x 3 workloads + peers stay near ten minutes
# of SmolLM2 on two CPU cores (raise --requests / the caps for a longer, queued slice).
FULL = {"requests": 24, "max_prompt": 128, "max_output": 32, "probe_mb": 512, "probe_batch": 64}
FULL |= {"matmul_n": 2048, "probe_prompt": 64, "probe_steps": 16, "repeats": 3}
QUICK = {"requests": 6, "max_prompt": 24, "max_output": 8, "probe_mb": 16}
QUICK |= {"matmul_n": 128, "probe_prompt": 8, "probe_steps": 4, "repeats": 1}


class NullHooks:
    """The engine's hooks, doing nothing: no observer costs a measured step anything."""

    def on_step_end(self, stats: Any) -> None:
        pass

    def on_request_finished(self, request: Any) -> None:
        pass


def compose_cfg(overrides: list[str]) -> DictConfig:
    return _composed(tuple(overrides))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    """Composed once per distinct override list (Hydra takes a good part of a second)."""
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose(config_name="config", overrides=list(overrides))


# ---- workloads ----------------------------------------------------------------------------
def fit(lengths: list[int], cap: int, how: str) -> list[int]:
    """Lengths brought under `cap`: `scale` multiplies all by cap / longest (the mix keeps
    its proportions), `clamp` cuts only those above; at least 1 token each."""
    longest = max(lengths)
    if how == "scale" and longest > cap:
        return [max(1, round(n * cap / longest)) for n in lengths]
    return [max(1, min(n, cap)) for n in lengths]


def fixed_specs(tok: Any, prompts: list[int], outputs: list[int], seed: int) -> list[RequestSpec]:
    wl = {"kind": "fixed", "prompt_lens": prompts, "output_lens": outputs, "seed": seed}
    return build_workload(wl, tok)


def azure_specs(tok: Any, args: argparse.Namespace, seed: int) -> list[RequestSpec]:
    rows = read_trace(Path(args.trace), 0, args.requests)
    prompts = fit([r.context_tokens for r in rows], args.max_prompt, args.fit)
    outputs = fit([r.generated_tokens for r in rows], args.max_output, args.fit)
    return fixed_specs(tok, prompts, outputs, seed)


def chat_queue(tok: Any, n: int, max_tokens: int) -> list[RequestSpec]:
    """The shipped chat prompts through the chat template, cycled to `n` requests (ids
    c0..), all queued at t=0, each generating exactly `max_tokens` (EOS ignored)."""
    chat = build_workload({"kind": "chat", "max_tokens": max_tokens}, tok)
    return [
        dataclasses.replace(
            chat[i % len(chat)],
            id=f"c{i}",
            sampling=dataclasses.replace(
                chat[i % len(chat)].sampling, max_tokens=max_tokens, ignore_eos=True
            ),
        )
        for i in range(n)
    ]


def straggler_specs(ctx: Context) -> list[RequestSpec]:
    cfg = compose_cfg([*ctx.overrides, "workload=straggler"])
    return build_workload(OmegaConf.to_container(cfg.workload, resolve=True), ctx.tok)


def open_loop(specs: list[RequestSpec], rate: float, seed: int) -> list[RequestSpec]:
    """The same requests, arriving as a Poisson process of `rate` per second from t=0."""
    arrivals = sample_arrivals(
        np.random.default_rng(seed), len(specs), process="poisson", rate=rate, cv=1.0
    )
    return [dataclasses.replace(s, arrival=float(a)) for s, a in zip(specs, arrivals, strict=True)]


# ---- systems ------------------------------------------------------------------------------
@dataclasses.dataclass
class Context:
    """What every run shares: the loaded model and the base config."""

    cfg: DictConfig
    overrides: list[str]
    model: Any
    tok: Any
    device: torch.device
    dtype: torch.dtype

    @property
    def pad(self) -> int:
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else 0


def combo_cfg(overrides: list[str], combo: tuple[str, str, str]) -> DictConfig:
    scheduler, allocator, output = combo
    return compose_cfg(
        [*overrides, f"scheduler={scheduler}", f"allocator={allocator}", f"output={output}"]
    )


def run_nanoserve(ctx: Context, combo: tuple[str, str, str], specs: list[RequestSpec]) -> Served:
    cfg = combo_cfg(ctx.overrides, combo)
    engine = build_engine(cfg, ctx.model, ctx.device, ctx.dtype, NullHooks())
    result = engine.run(specs, ctx.tok.eos_token_id)
    done = [s for s in result.seqs if s.finished_at is not None]
    return Served(
        outputs={s.id: list(s.output_token_ids) for s in result.seqs},
        arrival={s.id: s.arrival for s in result.seqs},
        first={s.id: s.first_token_at for s in done if s.first_token_at is not None},
        finish={s.id: s.finished_at for s in done},
        wall_s=summarize(result)["makespan_s"],
        steps=result.steps,
    )


def run_peer(ctx: Context, name: str, specs: list[RequestSpec]) -> Served:
    e = ctx.cfg.engine
    if name == "hf_static":
        return hf_static(ctx.model, specs, e.max_num_seqs, ctx.pad)
    return hf_cb(ctx.model, specs, e.max_num_seqs, e.max_num_batched_tokens, ctx.pad)


def run_same(ctx: Context, args: argparse.Namespace, n: int) -> tuple[list[RequestSpec], Any]:
    """`n` requests of the probe's prompt and output length through the reference engine,
    with room for all `n` in one batch (the probe's largest batch may exceed the runs')."""
    specs = fixed_specs(ctx.tok, [args.probe_prompt] * n, [args.probe_steps + 1] * n, 0)
    per_row = -(-(args.probe_prompt + args.probe_steps + 1) // ctx.cfg.engine.block_size)
    room = [f"engine.max_num_seqs={n}", f"engine.num_blocks={n * per_row}"]
    wide = dataclasses.replace(ctx, overrides=[*ctx.overrides, *room])
    return specs, run_nanoserve(wide, REFERENCE, specs).steps


# ---- rows ---------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def check_outputs(
    ctx: Context, specs: list[RequestSpec], served: Served, ref: Served
) -> tuple[bool, int, str]:
    """(equal under the tie rule, ties accepted, the first difference)."""
    ties = 0
    for s in specs:
        ours = served.outputs.get(s.id)
        if ours is None:
            return False, ties, f"{s.id}: no output"
        got = compare_greedy(ctx.model, s.prompt_token_ids, s.id, ours, ref.outputs[s.id])
        if not got.equal:
            return False, ties, got.reason
        ties += got.divergence is not None
    return True, ties, ""


def measure(specs: list[RequestSpec], served: Served) -> dict[str, Any]:
    """The time columns of a row, one formula for every system."""
    tokens = sum(s.sampling.max_tokens for s in specs)
    ids = [s.id for s in specs]
    ttft = [served.first[i] - served.arrival[i] for i in ids if i in served.first]
    tpot = [
        (served.finish[i] - served.first[i]) / (len(served.outputs[i]) - 1)
        for i in ids
        if i in served.first and i in served.finish and len(served.outputs[i]) > 1
    ]
    wall = served.wall_s
    decode = decode_steps(served.steps)
    return {
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "requests_per_s": len(specs) / wall if wall > 0 else None,
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
        "tpot_p50": pct(tpot, 50),
        "tpot_p99": pct(tpot, 99),
        "host_overhead_share": mean([host_share(st) for st in decode]),
        "host_overhead_share_b8": mean([host_share(st) for st in decode if st.rows == 8]),
    }


def make_row(
    system: str,
    combo: tuple[str, str, str] | None,
    workload: str,
    specs: list[RequestSpec],
    checked: tuple[bool, int, str],
    served: Served | None,
) -> dict[str, Any]:
    equal, ties, why = checked
    row: dict[str, Any] = dict.fromkeys(COLUMNS, None)
    scheduler, allocator, output = combo or ("", "", "")
    row |= {"system": system, "scheduler": scheduler, "allocator": allocator, "output": output}
    row |= {"workload": workload, "requests": len(specs), "outputs_equal": equal, "ties": ties}
    row["output_tokens"] = sum(s.sampling.max_tokens for s in specs)
    if equal and served is not None:
        row |= measure(specs, served)
    notes = [why, served.note if served else ""]
    if equal and served is not None and system != "nanoserve" and not served.first:
        notes.append("TTFT/TPOT not observable")
    row["note"] = "; ".join(n for n in notes if n)
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's tokens/s over each peer's, on the same workload in the same dtype."""
    for peer in PEERS:
        base = {(r["workload"], r["dtype"]): r["tokens_per_s"] for r in rows if r["system"] == peer}
        for r in rows:
            b = base.get((r["workload"], r["dtype"]))
            if b and r["tokens_per_s"]:
                r[f"ratio_vs_{peer}"] = r["tokens_per_s"] / b


# ---- the run ------------------------------------------------------------------------------
def plan(args: argparse.Namespace) -> list[tuple[str, tuple[str, str, str] | None]]:
    """(system, combo) per run of one workload, nanoserve's reference first."""
    combos = [(s, a, o) for s in args.schedulers for a in args.allocators for o in args.outputs]
    combos = [REFERENCE, *(c for c in combos if c != REFERENCE)]
    return [("nanoserve", c) for c in combos] + [(p, None) for p in args.peers]


def serve(
    ctx: Context, system: str, combo: tuple[str, str, str] | None, specs: list[RequestSpec]
) -> Served:
    return run_nanoserve(ctx, combo, specs) if combo else run_peer(ctx, system, specs)


def serve_workload(
    ctx: Context,
    args: argparse.Namespace,
    workload: str,
    specs: list[RequestSpec],
    tick: Callable[[str], None],
) -> list[dict[str, Any]]:
    """One row per system. The reference and the peers, whose ratios are the targets, run
    `args.repeats` times in turn (so that a slow spell of a shared machine falls on all of
    them) and report their median run; the other combinations run once."""
    systems = plan(args)
    runs: dict[int, list[Served]] = {i: [] for i in range(len(systems))}
    failed: dict[int, str] = {}
    for rnd in range(args.repeats):
        for i, (system, combo) in enumerate(systems):
            repeated = combo is None or combo == REFERENCE
            if i in failed or (rnd > 0 and not repeated):
                continue
            try:
                runs[i].append(serve(ctx, system, combo, specs))
            except Exception as exc:  # a peer that fails is a row that says so, not a crash
                if combo == REFERENCE:
                    raise
                failed[i] = f"failed: {type(exc).__name__}: {exc}"
    ref = runs[0][0]
    rows = []
    for i, (system, combo) in enumerate(systems):
        label = f"{system} {'/'.join(combo)}" if combo else system
        served, checked = None, (False, 0, failed.get(i, ""))
        if runs[i]:
            served = sorted(runs[i], key=lambda x: x.wall_s)[(len(runs[i]) - 1) // 2]
            checks = [check_outputs(ctx, specs, x, ref) for x in runs[i]]
            checked = next((c for c in checks if not c[0]), checks[0])
        r = make_row(system, combo, workload, specs, checked, served)
        if len(runs[i]) > 1 and r["outputs_equal"]:
            walls = sorted(x.wall_s for x in runs[i])
            spread = f"median of {len(walls)} runs (wall {walls[0]:.3g}-{walls[-1]:.3g} s)"
            r["note"] = "; ".join(n for n in (r["note"], spread) if n)
        if combo == REFERENCE:  # the kernels' share of its steps
            r["linear_alone_s"] = linears_alone_s(ctx.model, served.steps)
        if not r["outputs_equal"]:
            warn = f"WARNING {workload} {label}: outputs differ, no times: {r['note']}"
            print(warn, file=sys.stderr, flush=True)
        tick(f"{workload:13s} {label:45s} {fmt(r['tokens_per_s'])} tok/s")
        rows.append(r)
    return rows


def benchmark(
    args: argparse.Namespace, overrides: list[str]
) -> tuple[list[dict[str, Any]], Probe | None, str, dict[str, str]]:
    """One dtype's rows, its machine probe, how the open-loop rate was chosen, and the
    kernels the executor chose on this machine (as its `describe()` says)."""
    cfg = compose_cfg(overrides)
    for _, combo in plan(args):  # a misspelt policy fails now, not after the model loads
        if combo:
            check_before_loading(combo_cfg(overrides, combo))
    torch.manual_seed(cfg.seed)
    model, tok, device, dtype = load(cfg)
    ctx = Context(cfg, overrides, model, tok, device, dtype)
    # The kernels this machine gets for this model and dtype (measured once, then kept).
    chosen = build_engine(combo_cfg(overrides, REFERENCE), model, device, dtype, NullHooks())
    kernels = chosen.executor.describe()
    total = len(args.workloads) * len(plan(args)) + int(not args.no_probe)
    rows: list[dict[str, Any]] = []
    machine, rate_note = None, ""
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("benchmark", total=total)

        def tick(line: str) -> None:
            bar.console.print(line)
            bar.advance(task)

        warm = fixed_specs(tok, [4, 6], [3, 3], cfg.seed)  # first calls, outside any clock
        run_nanoserve(ctx, REFERENCE, warm)
        hf_static(model, warm, 2, ctx.pad)
        if not args.no_probe:
            machine = probe(
                model,
                lambda n: run_same(ctx, args, n),
                args.probe_batch or cfg.engine.max_num_seqs,
                torch.get_num_threads(),
                args.probe_mb,
                args.matmul_n,
            )
            tick(f"machine: {machine.bandwidth_gbs:.3g} GB/s, {machine.matmul_gflops:.3g} GFLOP/s")
        azure = any(w.startswith("azure") for w in args.workloads)
        closed = azure_specs(tok, args, cfg.seed) if azure else []  # the trace, when needed
        warmed = False
        for workload in args.workloads:
            if workload == "straggler":
                specs = straggler_specs(ctx)
            elif workload == "azure_closed":
                specs = closed
            elif workload == "chat48":
                specs = chat_queue(tok, CHAT_QUEUE, args.max_output)
            else:
                rate, rate_note = open_rate(ctx, args, rows, closed)
                specs = open_loop(closed, rate, cfg.seed)
            if workload in ("straggler", "chat48") or not warmed:
                # Untimed, the shapes of this workload's steps once: oneDNN prepares each new
                # input shape on first sight, which would otherwise fall on whichever system
                # happens to run first (the reference) and skew its times and ratios.
                first = closed if workload.startswith("azure") else specs
                run_nanoserve(ctx, REFERENCE, first)
                warmed = warmed or workload.startswith("azure")
            rows += serve_workload(ctx, args, workload, specs, tick)
    for r in rows:
        r["dtype"] = cfg.dtype
    add_ratios(rows)
    return rows, machine, rate_note, kernels


def default_jobs(
    overrides: list[str], dtypes: list[str], repeats: int
) -> tuple[dict[str, float], list[float]]:
    """Tokens/s of the default job (`python run.py` in each dtype: the chat prompts, EOS
    honoured, invariant checks on), each dtype's model loaded once, in `repeats` rounds that
    alternate the order, so that the ratio between dtypes is taken minutes apart rather than
    a whole benchmark pass apart. Returns each dtype's median tokens/s and, with two dtypes,
    each round's ratio of the second to the first. Outputs end where each model puts EOS, so
    the dtypes may generate different counts; tokens/s compares them."""
    jobs = []
    for dt in dtypes:
        kept = [o for o in overrides if not o.startswith("dtype=")]
        cfg = compose_cfg([*kept, f"dtype={dt}", "engine.check_invariants=true"])
        model, tok, device, dtype = load(cfg)
        specs = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), tok)
        jobs.append((dt, cfg, model, tok, device, dtype, specs))

    def rate(job: tuple[Any, ...]) -> float:
        _, cfg, model, tok, device, dtype, specs = job
        engine = build_engine(cfg, model, device, dtype, NullHooks())
        s = summarize(engine.run(specs, tok.eos_token_id))
        return s["tokens_kept"] / s["makespan_s"] if s["makespan_s"] else 0.0

    for job in jobs:  # untimed: kernels chosen, oneDNN's shapes prepared
        rate(job)
    rates: dict[str, list[float]] = {dt: [] for dt in dtypes}
    ratios = []
    for r in range(repeats):
        order = jobs if r % 2 == 0 else jobs[::-1]
        got = {job[0]: rate(job) for job in order}
        for dt, v in got.items():
            rates[dt].append(v)
        if len(dtypes) == 2 and got[dtypes[0]]:
            ratios.append(got[dtypes[1]] / got[dtypes[0]])
    return {dt: float(np.median(v)) for dt, v in rates.items()}, ratios


def open_rate(
    ctx: Context, args: argparse.Namespace, rows: list[dict[str, Any]], closed: list[RequestSpec]
) -> tuple[float, str]:
    """The open loop's arrival rate: `--rate`, else `--load` x the queued slice's capacity."""
    if args.rate:
        return args.rate, f"{args.rate:.4g} requests/s (--rate)"
    found = [r for r in rows if r["workload"] == "azure_closed" and is_reference(r)]
    capacity = found[0]["requests_per_s"] if found else None
    if capacity is None:  # the queued slice was not run (or not timed): measure it now
        served = run_nanoserve(ctx, REFERENCE, closed)
        capacity = len(closed) / served.wall_s
    rate = args.load * capacity
    return rate, f"{rate:.4g} requests/s = {args.load} x {capacity:.4g} (queued-slice capacity)"


# ---- command line -------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def names(allowed: tuple[str, ...] | None) -> Callable[[str], list[str]]:
        def split(text: str) -> list[str]:
            got = [x for x in text.split(",") if x]
            bad = [x for x in got if allowed and x not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad[0]!r}: choose from {', '.join(allowed)}")
            return got

        return split

    ap.add_argument("--schedulers", type=names(None), default="static,continuous,sjf,priority")
    ap.add_argument("--allocators", type=names(None), default="worst_case,incremental")
    ap.add_argument("--outputs", type=names(None), default="immediate,deferred")
    ap.add_argument("--workloads", type=names(WORKLOADS), default=",".join(WORKLOADS))
    ap.add_argument("--peers", type=names(PEERS), default=",".join(PEERS), help="'' for none")
    ap.add_argument("--requests", type=int, help="Azure slice: first N rows (24; quick 6)")
    ap.add_argument("--max-prompt", type=int, help="prompt tokens cap (128; quick 24)")
    ap.add_argument("--max-output", type=int, help="output tokens cap (32; quick 8)")
    ap.add_argument("--fit", choices=("scale", "clamp"), default="scale")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--load", type=float, default=0.9, help="open loop: share of capacity")
    ap.add_argument("--rate", type=float, default=None, help="open loop: requests/s (fixed)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="tiny model and tiny sizes")
    ap.add_argument(
        "--dtypes",
        type=names(("float32", "bfloat16", "float16")),
        default=None,
        help="dtypes to run, each against the peers in the same dtype (default: float32, and "
        "bfloat16 where the CPU has native bf16; or the run's dtype= if given)",
    )
    ap.add_argument(
        "--no-default-job",
        dest="default_job",
        action="store_false",
        help="skip timing the default job (run.py's chat prompts, EOS honoured) per dtype",
    )
    ap.add_argument("--no-probe", action="store_true", help="skip the machine section")
    ap.add_argument(
        "--probe-batch",
        type=int,
        help="rows of the largest-batch probe (64; quick: engine.max_num_seqs)",
    )
    for name in ("probe_mb", "matmul_n", "probe_prompt", "probe_steps"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name)
    ap.add_argument(
        "--repeats",
        type=int,
        help="runs of the reference and of each peer per workload, median reported (3; quick 1)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmark")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run config")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def dtypes_to_run(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    """`--dtypes`, else the run's `dtype=` if one was given, else float32 and, where the CPU
    computes bf16 natively (AVX512-BF16 or AMX), bfloat16."""
    if args.dtypes:
        return args.dtypes
    if any(o.startswith("dtype=") for o in overrides):
        return [str(compose_cfg(overrides).dtype)]
    isa = isa_flags()
    native = isa["avx512_bf16"] or isa["amx_bf16"]
    return ["float32", "bfloat16"] if native and not args.quick else ["float32"]


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    overrides = [*BASE, *(["model=tiny"] if args.quick else []), *args.overrides]
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or compose_cfg(overrides).threads or threads)
    t0, load_start = time.perf_counter(), os.getloadavg()[0]  # other jobs skew every time
    passes: list[Pass] = []
    ratios: list[float] = []
    try:
        dtypes = dtypes_to_run(args, overrides)
        for dt in dtypes:
            over = [*(o for o in overrides if not o.startswith("dtype=")), f"dtype={dt}"]
            rows, machine, rate_note, kernels = benchmark(args, over)
            passes.append(Pass(dt, rows, machine, rate_note, None, kernels))
        if args.default_job:
            jobs, ratios = default_jobs(overrides, dtypes, args.repeats)
            for p in passes:
                p.default_job_tps = jobs.get(p.dtype)
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)  # a caller in the same process keeps its setting
    cfg = compose_cfg(overrides)
    command = " ".join(
        ["python -m experiments.benchmark", *(sys.argv[1:] if argv is None else argv)]
    )
    header = {
        "command": f"`{command}`",
        "model": f"{cfg.model.source}, {', '.join(p.dtype for p in passes)}, "
        f"{resolve_device(cfg.device)}, {threads_used} threads",
        "engine": f"max_num_seqs {cfg.engine.max_num_seqs}, block_size {cfg.engine.block_size}",
        "reference": "nanoserve " + "/".join(REFERENCE) + " (outputs and capacity)",
        "machine": f"{environment_tags()['machine.cpu']}, {os.cpu_count()} cores, ISA "
        f"{isa_summary()}; load average {load_start:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end",
        **{
            f"kernels ({p.dtype})": f"linears {p.kernels.get('linears', '?')}; decode "
            f"attention {p.kernels.get('decode_attention', '?')}; argmax "
            f"{p.kernels.get('argmax', '?')}"
            for p in passes
        },
        **{f"open-loop rate ({p.dtype})": p.rate_note or "(not run)" for p in passes},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "benchmark wall time": f"{time.perf_counter() - t0:.1f} s",
    }
    files = write(args.out, passes, header, ratios)
    print(files[1].read_text())
    log_mlflow(cfg, args, files, headline(passes, ratios))
    print(f"results in {args.out}")
    return args.out


if __name__ == "__main__":
    main()
