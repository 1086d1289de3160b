"""Benchmark: the same workload through nanoserve and Hugging Face's own serving paths.

    python -m experiments.benchmark                            # SmolLM2, every combination
    python -m experiments.benchmark --quick --out /tmp/bench   # tiny model, a minute or less
    python -m experiments.benchmark --requests 16 --peers hf_cb --workloads azure_closed \\
        --schedulers continuous,static engine.max_num_seqs=8

Systems: nanoserve for each scheduler x allocator x output policy; `hf_static`
(`model.generate` on left-padded static batches) and `hf_cb` (transformers' continuous
batching), see `peers.py`. All greedy, EOS ignored (every request generates
exactly its length), one loaded model, one dtype, one thread count, one process.
`--peers ...,llamacpp` adds two servers driven over HTTP by one async client: nanoserve's
`serve.py` and llama.cpp's `llama-server` (built from source once, minutes; never in CI),
on the same weights, slots and threads (`http_peers.py`, `llamacpp.py`).

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
matmul rate (see `probe.py`). Seconds describe this machine only, under its load at the
time: run on a quiet machine before quoting them. Every run is logged to MLflow.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from rich.console import Console
from rich.progress import Progress

from experiments.bench.batch_sweep import run_sweep
from experiments.bench.http_peers import HTTP_SYSTEMS, HttpPeers
from experiments.bench.peers import hf_static
from experiments.bench.probe import Probe, probe
from experiments.bench.report import Pass, headline, is_reference, write
from experiments.bench.rows import add_ratios, serve_workload
from experiments.bench.systems import (
    DEFAULT_PEERS,
    PEERS,
    combo_cfg,
    plan,
    run_nanoserve,
    run_same,
)
from experiments.toolkit import cli
from experiments.toolkit.config import REFERENCE, TIMED
from experiments.toolkit.engine import Context
from experiments.toolkit.workloads import (
    azure_specs,
    chat_queue,
    fixed_specs,
    open_loop,
    straggler_specs,
)
from framework.core.request import RequestSpec
from framework.run.app import build_engine, check_before_loading, load, resolve_device
from framework.run.compose import compose_cfg
from framework.run.in_process import NullHooks, threads_kept
from framework.run.paths import OUTPUTS
from framework.run.summary import summarize
from framework.tracking.machine import isa_flags, isa_summary
from framework.tracking.tags import environment_tags
from framework.tracking.tool_run import command_line, log_run
from framework.workloads import build_workload

WORKLOADS = ("straggler", "azure_closed", "azure_open", "chat48")
CHAT_QUEUE = 48  # chat48: the shipped chat prompts, repeated to this many, all queued
# Full-run sizes: every nanoserve combination on each workload, and the peers, in minutes of
# SmolLM2 on a small CPU (raise --requests / the caps for a longer, queued slice).
FULL = {"requests": 24, "max_prompt": 128, "max_output": 32, "probe_mb": 512, "probe_batch": 64}
FULL |= {"matmul_n": 2048, "probe_prompt": 64, "probe_steps": 16, "rounds": 3}
FULL |= {"sweep_prompt": 128, "sweep_gen": 32}
QUICK = {"requests": 6, "max_prompt": 24, "max_output": 8, "probe_mb": 16}
QUICK |= {"sweep_prompt": 16, "sweep_gen": 4}
QUICK |= {"matmul_n": 128, "probe_prompt": 8, "probe_steps": 4, "rounds": 1}


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
    servers: Any = contextlib.nullcontext()
    if set(args.peers) & set(HTTP_SYSTEMS):  # started on first use, stopped with the pass
        threads = torch.get_num_threads()
        slots, source = cfg.engine.max_num_seqs, cfg.model.source
        servers = HttpPeers(overrides, slots, threads, cfg.dtype, args.out, source)
        ctx.http = servers
    with servers, Progress(console=Console(stderr=True), transient=True) as bar:
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
                specs = straggler_specs(ctx.overrides, tok)
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
    overrides: list[str], dtypes: list[str], rounds: int
) -> tuple[dict[str, float], list[float]]:
    """Tokens/s of the default job (`python run.py` in each dtype: the chat prompts, EOS
    honoured, invariant checks on), each dtype's model loaded once, in `rounds` rounds that
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
    for r in range(rounds):
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
    ap = cli.parser(__doc__)
    names = cli.comma_list
    ap.add_argument("--schedulers", type=names(), default="static,continuous,sjf,priority")
    ap.add_argument("--allocators", type=names(), default="worst_case,incremental")
    ap.add_argument("--outputs", type=names(), default="immediate,deferred")
    ap.add_argument("--workloads", type=names(WORKLOADS), default=",".join(WORKLOADS))
    ap.add_argument(
        "--peers",
        type=names(PEERS),
        default=",".join(DEFAULT_PEERS),
        help="'' for none; llamacpp (not by default: built from source once, minutes) also "
        "serves nanoserve through serve.py",
    )
    cli.add_azure_slice(ap)
    ap.add_argument("--load", type=float, default=0.9, help="open loop: share of capacity")
    ap.add_argument("--rate", type=float, default=None, help="open loop: requests/s (fixed)")
    cli.add_threads(ap)
    cli.add_quick(ap, "tiny model and tiny sizes")
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
        "--batch-sweep",
        type=lambda t: [int(x) for x in t.split(",") if x],
        help="only a batch-size sweep as llama-batched-bench makes one (batch_sweep.py), e.g. "
        "1,2,4,8,16,32,64",
    )
    ap.add_argument("--sweep-prompt", type=int, help="the sweep's prompt tokens (128; quick 16)")
    ap.add_argument("--sweep-gen", type=int, help="the sweep's generated tokens (32; quick 4)")
    ap.add_argument("--llama-batched-bench", help="llama.cpp's binary, for the sweep's peer")
    ap.add_argument("--gguf", help="the GGUF file llama-batched-bench runs")
    ap.add_argument(
        "--probe-batch",
        type=int,
        help="rows of the largest-batch probe (64; quick: engine.max_num_seqs)",
    )
    for name in ("probe_mb", "matmul_n", "probe_prompt", "probe_steps"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name)
    cli.add_rounds(
        ap,
        None,
        "rounds of the reference and of each peer per workload, median reported (3; quick 1)",
    )
    cli.add_out(ap, OUTPUTS / "benchmark")
    cli.add_overrides(ap)
    args = ap.parse_args(argv)
    cli.fill_sizes(args, FULL, QUICK)
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
    overrides = cli.run_overrides(args, TIMED)
    t0, load_start = time.perf_counter(), os.getloadavg()[0]  # other jobs skew every time
    passes: list[Pass] = []
    ratios: list[float] = []
    with threads_kept() as threads:
        torch.set_num_threads(args.threads or compose_cfg(overrides).threads or threads)
        dtypes = dtypes_to_run(args, overrides)
        if args.batch_sweep:
            return run_sweep(args, dtypes, overrides)
        for dt in dtypes:
            over = [*(o for o in overrides if not o.startswith("dtype=")), f"dtype={dt}"]
            rows, machine, rate_note, kernels = benchmark(args, over)
            passes.append(Pass(dt, rows, machine, rate_note, None, kernels))
        if args.default_job:
            jobs, ratios = default_jobs(overrides, dtypes, args.rounds)
            for p in passes:
                p.default_job_tps = jobs.get(p.dtype)
        threads_used = torch.get_num_threads()
    cfg = compose_cfg(overrides)
    command = command_line("benchmark", argv)
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
            f"kernels ({p.dtype})": f"linears {p.kernels.get('linears', '?')}; small-row "
            f"linears {p.kernels.get('small_linear', '?')}; decode "
            f"attention {p.kernels.get('decode_attention', '?')}; argmax "
            f"{p.kernels.get('argmax', '?')}; layer glue {p.kernels.get('layer_glue', '?')}"
            for p in passes
        },
        **{f"open-loop rate ({p.dtype})": p.rate_note or "(not run)" for p in passes},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "benchmark wall time": f"{time.perf_counter() - t0:.1f} s",
    }
    files = write(args.out, passes, header, ratios)
    print(files[1].read_text())
    log_run(cfg, args, files, headline(passes, ratios), tool="benchmark")
    print(f"results in {args.out}")
    return args.out
