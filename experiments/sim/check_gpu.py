"""The simulator check on a GPU: a few small cases served for real on the GPU, each also
simulated twice, with the analytic profile of this GPU and with a profile measured on it;
TTFT, TPOT, makespan and the device's busy seconds, real against each simulation as a
ratio, in a table (`sim_check_gpu.md`, `sim_check_gpu.json`).

    python -m experiments.sim_check device=cuda          # SmolLM2, a brief calibration first
    python -m experiments.sim_check device=cuda dtype=bfloat16 --profile PROFILE.yaml
    python -m experiments.sim_check --dry-run            # the same code on the CPU

Chosen whenever the run's device is CUDA (or with `--dry-run`, which runs it on the CPU on
the tiny model at the quick sizes, unless a `model=` is given, so the script is known to
work before a GPU runs it; its numbers describe nothing).

The cases (of `--workloads`): the straggler preset and, where the Azure trace is present, the
benchmark's queued slice (`--requests`, `--max-prompt`, `--max-output`), each under the
reference policy (continuous/incremental/immediate) and under deferred output at window 4.
Each is served once untimed (the kernels' compiles), then `--rounds` times for real (each
metric the median over the rounds), then simulated with each profile, replaying the first
real run's tokens, with the host time of `--host-time` (by default the simulated engine's
own, measured on this machine's CPU).

The analytic profile is that of the hardware spec named by `--hardware`, or else the one that
`torch.cuda.get_device_name` names (`hardware_for`); the measured profile is `--profile`, or
else made now: the executor timed over `brief_cuda_grid` (the tiny model's quick grid in a
dry run) and fitted, as `experiments.calibrate` does, the device's seconds of each step read
from CUDA events (framework/executors/device_time.py). Each deviation is set against the 10%
target: `within 10%` or `missed`. A deviation never fails the check; a run that fails does
(exit status 1, after the report is written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from experiments.sim.check_cases import DEFERRED, Case
from experiments.sim.check_sides import (
    Setup,
    serve_real,
    serve_sim,
    sim_overrides,
    split_overrides,
)
from experiments.toolkit.config import REFERENCE
from experiments.toolkit.engine import Context
from experiments.toolkit.report import num, percent
from experiments.toolkit.workloads import azure_specs, straggler_specs
from framework.calibration.analytic_profile import write as write_analytic
from framework.calibration.grid import brief_cuda_grid, quick_grid
from framework.core.request import RequestSpec
from framework.engine.loop import RunResult
from framework.executors.simulated.analytic import AnalyticProfile
from framework.executors.simulated.cost import read_profile
from framework.executors.simulated.gpu.hardware import load_hardware_spec
from framework.run.app import load, resolve_device
from framework.run.compose import compose_cfg
from framework.run.in_process import threads_kept
from framework.run.summary import summarize
from framework.tracking.tables import markdown_table

# metric -> the summary's key (seconds): what a user waits for, and the device's share of it
METRICS = {
    "ttft_p50": "ttft_p50_s",
    "tpot_p50": "tpot_p50_s",
    "makespan": "makespan_s",
    "device_busy": "busy_s",  # forward + sampling: on CUDA the device's, from its events
}
SIDES = ("analytic", "measured")  # the two simulations, as the table names them
TARGET = 0.10
WITHIN, MISSED = "within 10%", "missed"
COMBOS = (REFERENCE, DEFERRED)
# torch.cuda.get_device_name -> a shipped hardware spec (framework/executors/simulated/
# hardware): the first whose words are all in the name. An H100 that is not the SXM part
# (PCIe, NVL) gets the SXM's spec, the nearest shipped; the report names the spec used.
GPUS = (
    (("H200",), "h200"),
    (("H100",), "h100-sxm"),
    (("A100", "80GB", "PCIE"), "a100-80gb-pcie"),
    (("A100", "80GB"), "a100-80gb"),
    (("A100",), "a100-40gb"),
)


def hardware_for(gpu_name: str) -> str | None:
    """The shipped hardware spec for a GPU as CUDA names it, or None for one not shipped."""
    name = gpu_name.upper()
    return next((spec for words, spec in GPUS if all(w in name for w in words)), None)


@dataclasses.dataclass
class GpuRuns:
    """One case: its real runs and its simulation under each profile, or what failed."""

    case: Case
    specs: list[RequestSpec]
    real: list[RunResult] = dataclasses.field(default_factory=list)
    sims: dict[str, RunResult] = dataclasses.field(default_factory=dict)
    error: str | None = None


def analytic_file(hardware: str, shape: Any, dtype: str, out: Path) -> Path:
    """The analytic profile of the run's model on `hardware`, written where a simulated run
    reads it (`executor.profile`): named so, no shipped profile measured on this machine's CPU
    can stand in for it."""
    spec = load_hardware_spec(hardware)
    made_by = f"experiments.sim_check GPU mode: --hardware {hardware}"
    profile = AnalyticProfile.build(spec, shape.config.to_dict(), dtype, meta={"made_by": made_by})
    return write_analytic(profile, out / f"analytic-{spec['id']}.yaml")


def measured_file(
    args: argparse.Namespace, shared: list[str], out: Path, log: Callable[[str], None]
) -> tuple[Path, str]:
    """(the measured profile, how it came): `--profile`, or a brief calibration now."""
    if args.profile:
        return Path(args.profile), "--profile"
    from framework.calibration import fitting  # the calibration's own imports, only here

    grid = quick_grid() if args.dry_run else brief_cuda_grid()
    log(f"calibrating: {len(grid)} grid points, one pass")
    profile, _, _ = fitting.calibrate(
        shared, grid, gated=False, drift="none", max_wait_s=0.0, wait_budget_s=0.0, log=log
    )
    path = out / "measured-profile.yaml"
    profile.write(path)
    mape = profile.fit_report.get("forward_holdout_mape")
    return path, f"calibrated now over {len(grid)} grid points (forward held-out MAPE {mape})"


def cases(args: argparse.Namespace, ctx: Context) -> list[GpuRuns]:
    """Of `--workloads`, the straggler preset and the queued Azure slice (where the trace
    is), each under `COMBOS`."""
    specs = {}
    if "straggler" in args.workloads:
        specs["straggler"] = straggler_specs(ctx.overrides, ctx.tok)
    if "azure_closed" in args.workloads and Path(args.trace).is_file():
        specs["azure_closed"] = azure_specs(ctx.tok, args, ctx.cfg.seed)
    return [GpuRuns(Case(w, c, True), s) for w, s in specs.items() for c in COMBOS]


def serve_case(r: GpuRuns, real: Setup, sims: dict[str, Setup], rounds: int) -> None:
    """One untimed real run, `rounds` timed ones, then a simulation under each profile of
    the first timed one's tokens. A failure is kept in `r.error`, not raised."""
    try:
        serve_real(real, r.case, r.specs)  # compiles, first shapes: untimed
        r.real = [serve_real(real, r.case, r.specs) for _ in range(rounds)]
        replay = {s.id: list(s.output_token_ids) for s in r.real[0].seqs}
        for side, setup in sims.items():
            r.sims[side] = serve_sim(setup, r.case, r.specs, replay)[0]
    except Exception as exc:  # reported, and the exit status says so
        r.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)


def ratio(sim: float | None, real: float | None) -> float | None:
    return None if sim is None or not real else sim / real


def verdict(q: float | None) -> str:
    """Against the 10% target: a deviation is reported, never a failure."""
    return "-" if q is None else WITHIN if abs(q - 1) <= TARGET else MISSED


def rows(runs: list[GpuRuns]) -> list[dict[str, Any]]:
    """One row a case and metric: the real median, each simulation, its ratio and verdict."""
    out = []
    for r in runs:
        if r.error is not None:
            out.append({"case": r.case.name, "metric": "-", "error": r.error})
            continue
        real = [summarize(x) for x in r.real]
        sims = {side: summarize(x) for side, x in r.sims.items()}
        for metric, key in METRICS.items():
            got = [s[key] for s in real if s[key] is not None]
            row: dict[str, Any] = {"case": r.case.name, "metric": metric}
            row["real"] = statistics.median(got) if got else None
            for side, s in sims.items():
                q = ratio(s[key], row["real"])
                row |= {side: s[key], f"{side}_ratio": q}
                row[f"{side}_verdict"] = verdict(q)
            out.append(row)
    return out


def cell(row: dict[str, Any], side: str) -> str:
    q = row.get(f"{side}_ratio")
    if q is None:
        return num(row.get(side))
    return f"{num(row[side])} (x{q:.3f}, {percent(q - 1)}) {row[f'{side}_verdict']}"


def write(out: Path, table: list[dict[str, Any]], header: dict[str, str]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "sim_check_gpu.md", out / "sim_check_gpu.json"
    js.write_text(json.dumps({"header": header, "rows": table}, indent=1, default=str) + "\n")
    good = [r for r in table if "error" not in r]
    shown = [
        {
            "case": r["case"],
            "metric": r["metric"],
            "real": num(r["real"]),
            "analytic (simulated)": cell(r, "analytic"),
            "measured profile (simulated)": cell(r, "measured"),
        }
        for r in good
    ]
    lines = ["# nanoserve simulator check on a GPU", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += ["", "## Target", ""]
    for side in SIDES:
        got = [r[f"{side}_verdict"] for r in good if r.get(f"{side}_verdict") not in (None, "-")]
        lines.append(f"- {side}: {got.count(WITHIN)} of {len(got)} within 10%")
    lines += ["", "## Real against simulated", "", "Seconds: real (median of the rounds) / "]
    lines[-1] += "each simulation (its ratio to the real, its deviation) and the verdict."
    lines += ["", markdown_table(shown, list(shown[0]) if shown else ["case"])]
    failed = [r for r in table if "error" in r]
    if failed:
        lines += ["", "## Failed runs", "", *(f"- {r['case']}: {r['error']}" for r in failed)]
    md.write_text("\n".join(lines) + "\n")
    return md, js


def main(args: argparse.Namespace, overrides: list[str], command: str) -> Path:
    """The GPU mode of `experiments.sim_check` (see the module's note); exit status 1 when a
    run failed."""
    t0 = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    shared, sim_own = split_overrides(overrides)
    if args.dry_run:
        shared.append("device=cpu")
    cfg = compose_cfg(shared)
    device = resolve_device(str(cfg.device))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    hardware = args.hardware or (hardware_for(gpu) if gpu else "h200")
    chosen = (
        f"--hardware {args.hardware}"
        if args.hardware
        else f"the spec for {gpu!r}"
        if gpu
        else "the dry run's default"
    )
    if hardware is None:
        sys.exit(f"experiments.sim_check: no hardware spec for {gpu!r}; name one: --hardware")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with threads_kept() as threads:
        torch.set_num_threads(args.threads or cfg.threads or threads)
        measured, how = measured_file(args, shared, out, log)
        shape = load(compose_cfg([*shared, "executor=simulated"]))[0]  # the config, no weights
        analytic = analytic_file(hardware, shape, str(cfg.dtype), out)
        read_profile(measured)  # a missing or malformed file fails now
        torch.manual_seed(cfg.seed)
        model, tok, device, dtype = load(cfg)
        ctx = Context(cfg, shared, model, tok, device, dtype)
        sides = {"analytic": analytic, "measured": measured}
        sims = {
            k: Setup(ctx, shape, sim_overrides(sim_own, str(p), args.host_time))
            for k, p in sides.items()
        }
        real = Setup(ctx, shape, [])
        runs = cases(args, ctx)
        for r in runs:
            serve_case(r, real, sims, args.rounds)
            log(f"{r.case.name}: {'failed: ' + r.error if r.error else 'done'}")
    spec = load_hardware_spec(hardware)
    header = {
        "command": f"`{command}`",
        "what": "TTFT, TPOT, makespan and device busy seconds of executor=simulated (SIMULATED) "
        "against real runs of the same workloads, the simulation replaying the real tokens",
        "real side": f"{gpu or 'CPU (dry run)'}, {cfg.model.source}, {cfg.dtype}; median of "
        f"{args.rounds} run(s) a case after one untimed; forward and sampling seconds "
        + ("from CUDA events" if gpu else "the host's"),
        "analytic": f"{analytic} ({spec['name']}, {chosen})",
        "measured profile": f"{measured} ({how})",
        "host time": f"{args.host_time or 'measured'} (the simulated engine's own, this machine)",
        "target": "|simulated / real - 1| <= 10%: within 10%, else missed (reported, never a "
        "failure)",
        "wall time": f"{time.perf_counter() - t0:.1f} s",
    }
    if args.dry_run:
        header["DRY RUN"] = "on the CPU: the code path only; the numbers describe no GPU"
    table = rows(runs)
    md, _ = write(out, table, header)
    print(md.read_text())
    print(f"results in {out}")
    if any(r.error for r in runs):
        sys.exit(1)
    return out
