"""Simulator validation: the same workloads on the real and the simulated executor, and how
far the simulated seconds land from the measured ones.

    python -m experiments.sim_check                            # SmolLM2 fp32, shipped profile
    python -m experiments.sim_check dtype=bfloat16 --host-time model
    python -m experiments.sim_check --quick --profile /tmp/tiny.yaml --rounds 1   # tiny model
    python -m experiments.sim_check device=cuda      # on a GPU: its own mode (check_gpu.py)
    python -m experiments.sim_check --dry-run        # that mode on the CPU, tiny model

One process, one loaded model. Each case (a workload under one scheduler x allocator x output
policy) is served by the real engine once a round for `--rounds` rounds (5) and by the simulated
engine once, built from the same config with `executor=simulated` (the shipped profile for this
model x dtype, or `--profile`; host time `measured` unless `--host-time model`). The simulated
run replays the tokens of the first real run of its case (`TokenStreams` with a replay, as
`executor.replay` does), so wherever a workload honours EOS its stops land where the model put
them; every workload here ignores EOS anyway.

`--speed auto` takes the machine's drift out and leaves the profile's own error: it simulates at
`executor.speed` = the profile's canary (the median of the probes taken between its grid points,
or where a profile has none, the quietest) over the median canary around the kept real
runs, and `executor.compute_speed` from a second probe, a 128-token prefill, for the forward's
compute-bound seconds (a shared VM's neighbours take memory bandwidth more than arithmetic, so
the two slow apart). The report tallies the same real runs against the one-scalar correction
(the decode canary's speed alone) and against the profile as shipped, too.

Workloads: `straggler` (the preset); `azure_closed`, the benchmark's queued Azure slice (its
own construction, `toolkit.workloads.azure_specs`: the first `--requests` rows, lengths
scaled to the caps, all at t=0); `azure_open`, the same requests as a seeded Poisson process at
each of `--loads` (0.5, 0.9) x the capacity the real reference runs measured on the queued
slice (requests/s, median); `tight_pool`, the queued slice through a pool of `--tight-blocks`
blocks (default: a third of what the slice needs at once) with incremental allocation, so
that requests are preempted and recomputed. Policies: every scheduler x allocator with
immediate output, plus continuous/incremental with deferred output at window 4, on
`straggler` and `azure_closed` (`--matrix-workloads`); the others under the reference policy
(continuous/incremental/immediate) alone. `--quick`: the tiny model, small sizes and three
policies.

The real runs alternate their order from round to round (forward, then backward, as the A/B
tool does), so that a slow spell of a shared machine spreads over every case rather than
falling on one. A shared VM also slows by itself: before and after each real run a canary
(the calibrator's probe, five 1-row decode steps) and a prefill probe are timed, and their means
are set against the ones the profile recorded. A run taken while the canaries read more
than `--max-slow` slow, or while others took more than `--max-foreign` of the CPUs, is run again
once (the less disturbed kept). Reported per case:
the counts of the real and the simulated run (steps, token slots, preemptions, recomputed
tokens, overshoot; on a closed loop they must be equal), and for makespan, throughput, TTFT /
TPOT / e2e p50 and p99 the real value (the median of the runs), the simulated one, the relative
error and the real runs' own spread ((max - min) / median), with a verdict against the targets:
`met` (within 5% for makespan, throughput and the p50s, 10% for the p99s), `within real spread`
(outside the target but inside the spread), or `not met`; and the mean absolute percentage error
of each request's e2e (against the real runs' median for that request). Twins
(`check_noise.py`): closed-loop cases that took the same steps under other policies;
their real medians differ by the machine's noise alone, which the report measures so. Where
the seconds go (`sim_check_steps.csv` and the last table): each case's forward seconds by step
kind (prefill, decode, mixed), sampling and host time, real against predicted, to say which
steps a large error comes from.

The profile is fitted on the calibration grid only (`python -m experiments.calibrate`); a
profile whose fitted grid holds a point shaped like a validation workload is named in the
report. Writes `sim_check.csv`, `sim_check.md`, `sim_check_steps.csv` and `sim_check_pairs.csv`
(every closed-loop step, its features, real and predicted seconds) to `--out`; one MLflow parent
run (`nanoserve.kind=sim_check`) with the files and a child run per case.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from experiments.sim import check_gpu
from experiments.sim.check_cases import (
    WORKLOADS,
    Case,
    closed_cases,
    default_tight_blocks,
    open_cases,
    policy_combos,
)
from experiments.sim.check_machine import PREFILL_PROBE, Machine, rounds
from experiments.sim.check_noise import twin_rows
from experiments.sim.check_report import log_check, write
from experiments.sim.check_rows import METRICS, make_row, pair_rows, step_rows
from experiments.sim.check_sides import (
    Runs,
    Setup,
    makespan,
    serve_real,
    serve_sim,
    sim_overrides,
    split_overrides,
)
from experiments.toolkit import cli
from experiments.toolkit.config import REFERENCE, TIMED
from experiments.toolkit.engine import Context
from experiments.toolkit.report import percent
from experiments.toolkit.workloads import azure_specs, open_loop, straggler_specs
from framework.core.request import RequestSpec
from framework.executors.simulated.cost import read_profile
from framework.run.app import check_before_loading, load, resolve_device
from framework.run.compose import compose_cfg
from framework.run.in_process import threads_kept
from framework.run.paths import OUTPUTS
from framework.run.simulation import choose_profile
from framework.tracking.tags import environment_tags
from framework.tracking.tool_run import command_line

# Five rounds of real runs a case: three sample a shared VM's spells too thinly for a median
# or a spread (docs/simulator-validation.md).
FULL = {"requests": 24, "max_prompt": 128, "max_output": 32, "rounds": 5}
FULL |= {"max_foreign": 0.15, "max_slow": 0.1, "max_wait": 10.0}
# Quick runs are tests and smoke checks, on machines busy with other tests: no waiting.
QUICK = {"requests": 6, "max_prompt": 24, "max_output": 8, "rounds": 1}
QUICK |= {"max_foreign": 1.0, "max_slow": 1e9, "max_wait": 0.0}


def fitted_on(profile: str, workloads: dict[str, list[RequestSpec]]) -> list[str]:
    """The validation workloads shaped like a point the profile was fitted on (same number of
    requests, same distinct prompt lengths and longest output): calibrating on them would
    validate the fit on its own data."""
    try:
        grid = (read_profile(profile).get("meta") or {}).get("grid") or []
    except ValueError:
        return []
    found = []
    for name, specs in workloads.items():
        shape = (
            len(specs),
            sorted({len(s.prompt_token_ids) for s in specs}),
            max(s.sampling.max_tokens for s in specs),
        )
        for p in grid:
            if p.get("holdout"):
                continue
            if (p.get("requests"), p.get("prompt_lens"), p.get("max_output")) == shape:
                found.append(f"{name} (like the fitted point {p.get('name')})")
    return found


def sim_check(
    args: argparse.Namespace, overrides: list[str], log: Callable[[str], None]
) -> tuple[list[Runs], dict[str, str]]:
    """Every case served; (the runs, notes for the report's header)."""
    shared, sim_own = split_overrides(overrides)
    cfg = compose_cfg(shared)
    # The profile and every policy are checked before the model loads.
    sim_cfg = compose_cfg([*shared, *sim_overrides(sim_own, args.profile, args.host_time)])
    shape = load(sim_cfg)[0]  # the model's config and tokenizer, no weights
    profile = choose_profile(sim_cfg, shape)
    if profile is None:  # an analytic GPU's seconds say nothing about this CPU's real runs
        raise ValueError(
            f"no profile measured on this CPU for {sim_cfg.model.source} in {sim_cfg.dtype}; "
            "measure one with `python -m experiments.calibrate` and pass --profile PATH"
        )
    read_profile(profile)  # a missing or malformed file fails now
    sim = sim_overrides(sim_own, profile, args.host_time)
    for combo in policy_combos(args.quick):
        case = Case("straggler", combo, True)
        for side in ([], sim):
            check_before_loading(compose_cfg(case.overrides([*shared, *side])))
    torch.manual_seed(cfg.seed)
    model, tok, device, dtype = load(cfg)
    ctx = Context(cfg, shared, model, tok, device, dtype)
    setup = Setup(ctx, shape, sim)

    specs: dict[str, list[RequestSpec]] = {}
    if "straggler" in args.workloads:
        specs["straggler"] = straggler_specs(ctx.overrides, tok)
    azure = {"azure_closed", "azure_open", "tight_pool"} & set(args.workloads)
    if azure:
        if not Path(args.trace).is_file():
            raise ValueError(f"--trace {args.trace}: no such file (needed by {sorted(azure)})")
        specs["azure_closed"] = azure_specs(tok, args, cfg.seed)
    tight = args.tight_blocks
    if "tight_pool" in args.workloads:
        e = cfg.engine
        tight = tight or default_tight_blocks(specs["azure_closed"], e.block_size, e.max_num_seqs)
    notes = {"profile": profile, "host time": str(sim_cfg.executor.host_time)}
    if tight:
        notes["tight pool"] = f"engine.num_blocks={tight} (block_size {cfg.engine.block_size})"
    overlap = fitted_on(profile, specs)
    notes["calibration"] = (
        "WARNING: the profile was fitted on " + ", ".join(overlap)
        if overlap
        else "the profile's fitted grid holds none of these workloads"
    )
    if overlap:
        print(f"sim_check: {notes['calibration']}", file=sys.stderr)

    # Untimed, once: the kernels and oneDNN's shapes of each workload, the simulator's path.
    warm = [w for w in ("straggler", "azure_closed") if w in specs]
    for w in warm:
        serve_real(setup, Case(w, REFERENCE, True), specs[w])
    serve_sim(setup, Case(warm[0], REFERENCE, True), specs[warm[0]], None)
    log("warm-up done")

    closed = [
        Runs(c, specs["azure_closed" if c.workload == "tight_pool" else c.workload])
        for c in closed_cases(args, tight)
    ]
    machine = Machine(setup, profile)
    machine.probes()  # their first calls, untimed
    speeds = {"closed": rounds(machine, closed, args, log)}
    runs = list(closed)
    opened = open_cases(args)
    if opened:
        capacity = queued_capacity(setup, closed, specs["azure_closed"])
        notes["capacity"] = f"{capacity:.4g} requests/s (the queued slice, real reference, median)"
        open_runs = []
        for c in opened:
            load_share = float(c.workload.rsplit("_", 1)[1])
            rate = load_share * capacity
            notes[c.workload] = f"Poisson, {rate:.4g} requests/s = {load_share:g} x capacity"
            open_runs.append(Runs(c, open_loop(specs["azure_closed"], rate, cfg.seed)))
        speeds["open"] = rounds(machine, open_runs, args, log)
        runs += open_runs
    seen = sorted(machine.seen)
    quiet = machine.reference_s or machine.best_s
    notes["canary"] = (
        f"1-row decode step, median {seen[len(seen) // 2] * 1e3:.1f} ms over {len(seen)} probes "
        f"(quietest {seen[0] * 1e3:.1f} ms) against "
        + (f"{machine.reference} {quiet * 1e3:.1f} ms" if machine.reference_s else "the quietest")
    )
    pre = sorted(machine.prefill_seen)
    notes["prefill probe"] = (
        f"{PREFILL_PROBE}-token prefill, median {pre[len(pre) // 2] * 1e3:.1f} ms over "
        f"{len(pre)} probes (quietest {pre[0] * 1e3:.1f} ms) against "
        f"{machine.prefill_reference} {machine.prefill_reference_s * 1e3:.1f} ms; the profile "
        f"puts {machine.prefill_predicted[1] / max(machine.prefill_predicted[0], 1e-12):.0%} of "
        "it on compute"
    )
    if args.speed == "auto":
        notes["speed"] = (
            ", ".join(
                f"executor.speed {v:.3f}"
                + (f" and compute_speed {c:.3f}" if c is not None else "")
                + f" ({k} loop)"
                for k, (v, c) in speeds.items()
            )
            + ": the profile's canary over the median canary around the kept real runs, and the "
            "compute speed that predicts the prefill probes at their median (--speed auto)"
        )
    elif float(args.speed) != 1:
        notes["speed"] = f"executor.speed {float(args.speed):g} (--speed)"
    return runs, notes


def queued_capacity(setup: Setup, closed: list[Runs], specs: list[RequestSpec]) -> float:
    """Requests/s of the real reference runs on the queued slice (their median), measured now
    if that case was not among the closed ones."""
    found = [r for r in closed if r.case == Case("azure_closed", REFERENCE, True)]
    walls = [makespan(x) for x in found[0].real] if found else []
    if not walls:
        walls = [makespan(serve_real(setup, Case("azure_closed", REFERENCE, True), specs))]
    return len(specs) / statistics.median(walls)


# ---- command line -------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__)

    def speed(text: str) -> str:
        if text == "auto":
            return text
        try:
            ok = float(text) > 0
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r}: a number > 0, or auto")
        return text

    def loads(text: str) -> list[float]:
        return [float(x) for x in text.split(",") if x]

    ap.add_argument(
        "--profile", help="a profile file or shipped name (the one shipped for model x dtype)"
    )
    ap.add_argument(
        "--host-time",
        choices=("measured", "model"),
        help="the simulation's host time: this engine's own (measured, default) or the profile's",
    )
    ap.add_argument(
        "--speed",
        type=speed,
        default="1",
        help="the simulated machine's speed against the profile's (executor.speed): a number, "
        "or auto, from the canaries after the real runs (default 1: the profile as shipped)",
    )
    names = cli.comma_list
    ap.add_argument("--workloads", type=names(WORKLOADS), default=",".join(WORKLOADS))
    ap.add_argument(
        "--matrix-workloads",
        type=names(("straggler", "azure_closed")),
        default="straggler,azure_closed",
        help="the workloads served under every policy (the others: the reference alone)",
    )
    ap.add_argument("--loads", type=loads, default="0.5,0.9", help="open loop: shares of capacity")
    ap.add_argument(
        "--tight-blocks", type=int, help="the tight pool's engine.num_blocks (a third of a batch's)"
    )
    cli.add_azure_slice(ap)
    cli.add_rounds(ap, None, "rounds of real runs per case, median reported (5; quick 1)")
    cli.add_threads(ap)
    ap.add_argument(
        "--max-foreign",
        type=float,
        help="run a real run again when others took more of the CPUs meanwhile (0.15; 1: never; "
        "quick 1)",
    )
    ap.add_argument(
        "--max-slow",
        type=float,
        help="run a real run again when the canary after it was this much above the quiet one "
        "(0.1; quick, or --speed auto: never)",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        help="seconds to wait, before each real run, for the others to quieten (10; quick 0)",
    )
    cli.add_quick(ap, "tiny model, small sizes, three policies")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="the GPU mode (check_gpu.py) on the CPU, tiny model and quick sizes unless a "
        "model= is given: the script known to work before a GPU runs it",
    )
    ap.add_argument(
        "--hardware",
        help="GPU mode: the analytic profile's hardware spec (default: the one this GPU's name "
        "gives; h200 in a dry run)",
    )
    cli.add_out(ap, OUTPUTS / "sim_check")
    cli.add_overrides(ap)
    args = ap.parse_args(argv)
    if args.dry_run:
        args.quick = True
    if args.speed == "auto" and args.max_slow is None:
        # The probes set the simulated machine's speed: a run is not retried for being slow
        # (only for others taking the CPUs), which would spend minutes on a slow VM for
        # nothing.
        args.max_slow = 1e9
    cli.fill_sizes(args, FULL, QUICK)
    if args.max_foreign <= 0 or args.max_slow <= 0:
        ap.error("--max-foreign and --max-slow must be > 0 (1 and a large number: never)")
    if any(x <= 0 for x in args.loads):
        ap.error(f"--loads must be positive shares of capacity, got {args.loads}")
    return args


def on_gpu(overrides: list[str]) -> bool:
    """The run's device is CUDA: the check's GPU mode (check_gpu.py)."""
    try:
        return resolve_device(str(compose_cfg(overrides).device)).type == "cuda"
    except ValueError as err:
        sys.exit(f"experiments.sim_check: {err}")


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    overrides = cli.run_overrides(args, TIMED)
    shared = [o for o in overrides if not o.lstrip("+~").startswith("executor.")]
    if args.dry_run or on_gpu(shared):
        return check_gpu.main(args, overrides, command_line("sim_check", argv))
    with threads_kept() as threads:
        torch.set_num_threads(args.threads or compose_cfg(shared).threads or threads)
        t0, load_start = time.perf_counter(), os.getloadavg()[0]  # other jobs skew every time
        console = Console(stderr=True)
        try:
            runs, notes = sim_check(
                args, overrides, lambda line: console.print(line, highlight=False, soft_wrap=True)
            )
        except ValueError as err:
            sys.exit(f"experiments.sim_check: {err}")
        threads_used = torch.get_num_threads()
    rows = [make_row(r) for r in runs]
    alts: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        for label, result in r.alts.items():
            alts.setdefault(label, []).append(make_row(dataclasses.replace(r, sim=result)))
    shares = [f for r in runs for f in r.foreign]
    if shares:
        slow = f" or the canary over {args.max_slow:+.0%}" if args.max_slow < 1e6 else ""
        notes["others' CPU"] = (
            f"mean {statistics.mean(shares):.1%}, max {max(shares):.1%} of the CPUs during the "
            f"kept real runs; {sum(r.retried for r in runs)} run(s) measured again (others over "
            f"{args.max_foreign:.0%}{slow})"
        )
    steps = [s for r in runs for s in step_rows(r)]
    pairs = [p for r in runs for p in pair_rows(r)]
    cfg = compose_cfg(shared)
    env = environment_tags()
    command = command_line("sim_check", argv)
    data = read_profile(notes["profile"])
    meta, fit = data.get("meta") or {}, data.get("fit") or {}
    header = {
        "command": f"`{command}`",
        "model": f"{cfg.model.source}, {cfg.dtype}, {resolve_device(cfg.device)}, "
        f"{threads_used} threads",
        "engine": f"max_num_seqs {cfg.engine.max_num_seqs}, block_size {cfg.engine.block_size}",
        "real side": f"median of {args.rounds} run(s) per case, order alternating by round",
        "simulated side": f"one run per case, host time {notes.pop('host time')}, the first "
        "real run's tokens replayed",
        **notes,
        "profile made": f"{meta.get('date', '?')} on {(meta.get('machine') or {}).get('cpu', '?')}"
        f", commit {str(meta.get('commit', '?'))[:10]}",
        "profile fit": "forward, held-out grid points: per step MAPE "
        f"{percent(fit.get('forward_holdout_mape'), False)}, per run "
        f"{percent(fit.get('forward_holdout_run_mape'), False)}",
        "machine": f"{env['machine.cpu']}, {os.cpu_count()} cores, load average "
        f"{load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        "commit": f"{env['git.commit'][:10]} (dirty: {env['git.dirty']})",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "wall time": f"{time.perf_counter() - t0:.1f} s",
    }
    twins = twin_rows(runs, rows, list(METRICS))
    files = write(args.out, rows, steps, pairs, header, alts, twins)
    print(files[1].read_text())
    log_check(cfg, args, files, rows, header, twins)
    print(f"results in {args.out}")
    return args.out
