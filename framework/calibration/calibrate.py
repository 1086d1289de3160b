"""Calibrate: time the real executor over a grid of steps and fit a simulator profile.

    python -m experiments.calibrate                              # SmolLM2, float32, this CPU
    python -m experiments.calibrate dtype=bfloat16 --out smollm2-bf16.yaml
    python -m experiments.calibrate --quick --out /tmp/tiny.yaml  # tiny model, seconds
    python -m experiments.calibrate device=cuda                  # a GPU: one short script

One process, one loaded model. Each grid point is a `fixed` workload served by the real
engine (continuous batching, every request at t=0, so its steps are the same on every run):
N requests of prompt P give prefill steps of up to the token budget, then decode steps of N
rows at contexts P..P+out; more requests than `max_num_seqs`, with staggered output lengths,
give mixed steps (a newcomer's prefill beside the others' decodes); slices of the Azure trace
give the mix of lengths a real workload has. The executor is wrapped in a recorder that keeps
every step's `StepFeatures` and seconds (on CUDA the device's, from events on its stream read
after the point's run, not the launches', and no step made to wait for them); the engine's own
`StepStats` give its host time (on CUDA its launches in, its waits at the drains out).

Fitting (`fitting.py`, framework/executors/simulated/profile.py): non-negative least squares
on relative error, over the grid points not marked `holdout`; the error is reported on the held-out
points, whole configurations the fit never saw, not random steps of runs it did. The profile
(YAML) names the model, dtype, device, CPU and its ISA flags or GPU, threads, date and commit,
and holds the grid and the fit's errors. Logged to MLflow (nanoserve.kind=calibration).

The machine may be shared: a point during which other processes took more than
`--max-foreign` of the CPUs (from /proc/stat, less this process's own time) is measured
again, up to twice, and only undisturbed runs are fitted; a canary (a 1-row decode step) and a
prefill probe are timed at the start, the end and after every point. The profile records them
(docs/simulator-profiles.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig

from framework.calibration.fitting import DRIFT, calibrate
from framework.calibration.grid import cuda_grid, full_grid, quick_grid
from framework.calibration.profile_file import default_out, hardware_slug, report, write_raw
from framework.executors.simulated.profile import MeasuredProfile
from framework.run.app import resolve_device
from framework.run.compose import compose_cfg
from framework.run.in_process import threads_kept
from framework.tracking.tool_run import command_line, log_run


def log_profile(
    cfg: DictConfig, args: argparse.Namespace, profile: MeasuredProfile, files: list[Path]
) -> None:
    """The calibration's MLflow run: where it ran, the fit's report and every coefficient."""
    meta = profile.meta
    hardware = hardware_slug(torch.device(meta["device"]), meta["machine"])
    metrics = {f"fit.{k}": v for k, v in profile.fit_report.items()}
    metrics |= {"forward.intercept_s": profile.forward.intercept_s}
    metrics |= {f"forward.{t}": c for t, c in profile.forward.per.items()}
    metrics |= {f"sample.{t}": c for t, c in profile.sample.per.items()}
    metrics |= {"prepare.intercept_s": profile.prepare.intercept_s}
    metrics |= {f"prepare.{t}": c for t, c in profile.prepare.per.items()}
    metrics |= {
        "host.per_step_s": profile.host.per_step_s,
        "host.per_row_s": profile.host.per_row_s,
        "readback_s": profile.readback_s,
    }
    log_run(
        cfg,
        args,
        files,
        {k.replace(">", "_gt_"): v for k, v in metrics.items()},
        tool="calibrate",
        kind="calibration",
        name=f"calibrate {meta['model']} {meta['dtype']}",
        tags={"profile.hardware": hardware},
        params={
            "profile.model_id": meta["model_id"],
            "profile.cpu": meta["machine"]["cpu"],
            "profile.gpu": str(meta["machine"]["gpu"]),
        },
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the profile file (.yaml or .json); default outputs/calibrate/"
        "<model>-<dtype>-<hardware>.yaml",
    )
    ap.add_argument("--quick", action="store_true", help="the tiny model and a small grid")
    ap.add_argument("--raw", type=Path, default=None, help="also write every timed step (CSV)")
    ap.add_argument(
        "--max-foreign",
        type=float,
        default=0.05,
        help="measure a point again when others took more of all CPUs (0.05)",
    )
    ap.add_argument(
        "--ungated",
        action="store_true",
        help="measure every point once, whatever the machine is doing (tests)",
    )
    ap.add_argument(
        "--passes",
        type=int,
        default=None,
        help="measure the grid this many times, pooled (default 2; --quick 1)",
    )
    ap.add_argument(
        "--wait-budget",
        type=float,
        default=120.0,
        help="seconds of waiting for a quiet machine in the whole run (120); then measure on",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=60.0,
        help="seconds to wait, before measuring a point again, for the machine to quieten (60)",
    )
    ap.add_argument(
        "--drift",
        choices=DRIFT,
        default="probes",
        help="probes: fit each run's steps at the grid's median state, from the probes timed "
        "around it (default); none: as measured",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model=, dtype=, device=, ...)")
    return ap.parse_args(argv)


def run(args: argparse.Namespace, command: str = "") -> tuple[MeasuredProfile, Path]:
    """Calibrate, write the profile, report, log: (the profile, where it was written)."""
    overrides = [*(["model=tiny"] if args.quick else []), *args.overrides]
    on_cuda = resolve_device(str(compose_cfg(overrides).device)).type == "cuda"
    grid = quick_grid() if args.quick else cuda_grid() if on_cuda else full_grid()
    with threads_kept():
        profile, runs, cfg = calibrate(
            overrides,
            grid,
            passes=args.passes or (1 if args.quick else 2),
            max_foreign=args.max_foreign,
            max_wait_s=args.max_wait,
            wait_budget_s=args.wait_budget,
            gated=not args.ungated,
            drift=args.drift,
            command=command,
        )
    out = args.out or default_out(cfg, torch.device(profile.meta["device"]))
    profile.write(out)
    profile.source = str(out)
    with tempfile.TemporaryDirectory() as tmp:
        raw = args.raw or Path(tmp) / "calibration_steps.csv"
        write_raw(raw, runs)
        print(report(profile))
        print(f"profile written to {out}")
        log_profile(cfg, args, profile, [out, raw])
    return profile, out


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    command = command_line("calibrate", argv)
    try:
        return run(args, command)[1]
    except ValueError as err:
        sys.exit(f"experiments.calibrate: {err}")
