"""Fitting a profile to the grid's runs: which cost terms each code path gets, the runs kept
(those other processes left alone), each run taken to the grid's median machine state by
the probes around it, and the fit itself (framework/executors/simulated/profile.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from framework.calibration.grid import CANARY, PREFILL_CANARY, Point, decode, mixed
from framework.calibration.machine_watch import MachineWatch
from framework.calibration.point_run import PointRun, readback_seconds, serve_point
from framework.calibration.profile_file import make_meta
from framework.executors.simulated.profile import LinearCost, MeasuredProfile, Sample, fit_host
from framework.run.app import check_before_loading, load
from framework.run.compose import compose_cfg

# Forward terms, by the code path the steps take; NNLS drops (zeroes) what does not help.
# The terms: `linear_tokens` is what the Linear layers multiply (padded to oneDNN's buckets
# on CPU fp32); the hinges bend it from the memory-bound regime (a few rows: every weight
# read once, nearly flat up to 8 rows) to the compute-bound one; `rows` is the LM head, run
# on each row's last token only; `prefill_rows` each prompt's own attention call;
# `prefill_attn` the prompts' causal attention (queries x context); `decode_ctx` the KV the
# decode rows read; `padded` the packed layers' pad-and-slice (whenever the row count is off
# a bucket); `has_prefill` the prefill path's fixed cost. Which terms fit held-out runs best
# was measured, not guessed (docs/simulator-profiles.md).
CPU_PACKED_TERMS = (
    "linear_tokens",
    "linear_tokens>8",
    "linear_tokens>32",
    "rows",
    "prefill_rows",
    "prefill_attn",
    "decode_ctx",
    "padded",
    "has_prefill",
)
# Unpacked (stock linears: chosen on this machine, or packed_linears=false): no buckets, so
# the real token count.
# Decode attention there gathers every decode row's blocks padded to the longest context.
CPU_TERMS = (
    *(t.replace("linear_tokens", "num_tokens") for t in CPU_PACKED_TERMS if t != "padded"),
    "decode_padded_ctx",
)
# A GPU in eager mode is launch-bound up to hundreds of tokens: later hinges; per-row
# attention calls (prefill) and the padded decode gather cost launches and bandwidth.
CUDA_TERMS = (
    "num_tokens",
    "num_tokens>64",
    "num_tokens>256",
    "num_tokens>1024",
    "rows",
    "prefill_rows",
    "prefill_attn",
    "decode_rows",
    "decode_ctx",
    "decode_padded_ctx",
    "has_prefill",
)


def forward_terms(device: torch.device, packed: bool) -> tuple[str, ...]:
    if device.type == "cuda":
        return CUDA_TERMS
    return CPU_PACKED_TERMS if packed else CPU_TERMS


SAMPLE_TERMS = ("rows", "random_rows")
# The real executor's tensor preparation: a list entry per packed token (ids, positions, slot
# mapping), a block table per decode row (as long as its context), a few tensors per step.
PREPARE_TERMS = ("rows", "num_tokens", "decode_ctx")


# ---- the machine's drift -------------------------------------------------------------------
DRIFT = ("probes", "none")


def at_reference(
    m: PointRun,
    reference: tuple[float, float] | None = None,
    shape: LinearCost | None = None,
) -> list[Sample]:
    """A run's steps as samples to fit: as measured, or (given the grid's median probes and
    a first fit's `shape`) as the machine would have run them in that median state.

    A shared VM's speed wanders for minutes at a time, and not the same way for memory
    bandwidth as for arithmetic: a point's two passes, minutes apart, can differ by a good
    part of their summed forward seconds, small decode points one way and long prompts the
    other. Which point fell in which spell would then price small prefills against large
    ones, and every later simulation with them (docs/simulator-validation.md).
    The run's probes (`PointRun.probes`) say how slow the machine ran then: a step's
    memory-bound seconds are divided by the decode probe's ratio to `reference`, its
    compute-bound seconds (`LinearCost.split`) by the prefill probe's, as the simulator's
    `executor.speed` and `executor.compute_speed` divide them; sampling by the decode
    probe's."""
    if reference is None or shape is None or m.probes is None:
        return [Sample(f, fw, sm, m.point.name, prep) for f, fw, sm, prep in m.steps]
    decode = m.probes[0] / reference[0]
    compute = m.probes[1] / reference[1]
    out = []
    for f, fw, sm, prep in m.steps:
        total, comp = shape.split(f)
        share = comp / total if total > 0 else 0.0
        slow = (1 - share) * decode + share * compute
        out.append(Sample(f, fw / slow, sm / decode, m.point.name, prep))
    return out


def pass_spread(runs: list[PointRun], samples: list[list[Sample]]) -> float | None:
    """The median over the points measured more than once of (max - min) / min of their
    runs' summed forward seconds (`samples`: each run's, in the runs' order); None when no
    point was measured twice."""
    sums: dict[str, list[float]] = {}
    for m, run in zip(runs, samples, strict=True):
        sums.setdefault(m.point.name, []).append(sum(s.forward_s for s in run))
    spreads = [(max(v) - min(v)) / min(v) for v in sums.values() if len(v) > 1 and min(v) > 0]
    return statistics.median(spreads) if spreads else None


def clean_runs(runs: list[PointRun], watch: MachineWatch) -> list[PointRun]:
    """The runs of each point that other processes left alone; a point with none keeps its
    quietest run. Others' work only ever slows a step down, so its runs would bias every
    coefficient upward."""
    by: dict[str, list[PointRun]] = {}
    for m in runs:
        by.setdefault(m.point.name, []).append(m)
    kept: set[int] = set()
    for group in by.values():
        quiet = [m for m in group if not watch.busy(m)]
        kept |= {id(m) for m in quiet or [min(group, key=lambda m: m.foreign)]}
    return [m for m in runs if id(m) in kept]


def calibrate(
    overrides: list[str],
    grid: list[Point],
    *,
    passes: int = 1,
    max_foreign: float = 0.05,
    max_wait_s: float = 60.0,
    wait_budget_s: float = 120.0,
    gated: bool = True,
    drift: str = "probes",
    command: str = "",
    log: Callable[[str], None] = print,
) -> tuple[MeasuredProfile, list[PointRun], DictConfig]:
    """Load the model, warm it, measure every grid point `passes` times (the second pass in
    reverse order, so that a slow drift falls on every point alike), fit. `drift="probes"`
    fits each run's steps as the grid's median state would have run them (`at_reference`);
    `"none"` fits the seconds as measured."""
    if drift not in DRIFT:
        raise ValueError(f"--drift={drift}: must be one of {', '.join(DRIFT)}")
    base = compose_cfg(overrides)
    if base.executor.name != "model":
        raise ValueError(f"executor={base.executor.name}: calibration measures the real model")
    check_before_loading(base)
    if base.threads:
        torch.set_num_threads(int(base.threads))
    torch.manual_seed(base.seed)
    t0 = time.perf_counter()
    loaded = load(base)
    model, _, device, _ = loaded

    def serve(p: Point) -> PointRun:
        return serve_point(overrides, loaded, p, base.seed)

    # Untimed: the kernels built and loaded, oneDNN's first shapes, the allocator warm.
    for p in (
        decode(2, 24, 4),
        mixed(3, 40),
        decode(8, 8, 3, sampled=True),
        CANARY,
        PREFILL_CANARY,
    ):
        serve(p)
    readback = readback_seconds(device)
    watch = MachineWatch(serve, max_foreign, max_wait_s, wait_budget_s, enabled=gated)
    canary_start = watch.canary()
    order = [p for k in range(passes) for p in (grid if k % 2 == 0 else grid[::-1])]
    runs: list[PointRun] = []
    for i, p in enumerate(order, 1):
        got = watch.measure(p)
        runs.append(got)
        fwd = sum(s[1] for s in got.steps)
        log(
            f"[{i:2d}/{len(order)}] {p.name:16s} {'holdout' if p.holdout else 'fit':7s} "
            f"{len(got.steps):3d} steps  wall {got.wall_s:6.2f} s  forward {fwd:6.2f} s  "
            f"others' CPU {got.foreign:4.0%}"
            + (f"  ({got.attempts} tries)" if got.attempts > 1 else "")
        )
    paths = runs[0].extra
    canary_end = watch.canary()
    used = clean_runs(runs, watch) if gated else runs
    measured = [at_reference(m) for m in used]  # each run's samples
    host_rows, host_s = [], []
    for m in used:
        if not m.point.holdout:
            host_rows += [st.rows for st in m.stats]
            host_s += m.host(readback)
    meta = make_meta(base, model, device, grid, command, paths)

    def fit(samples: list[Sample]) -> MeasuredProfile:
        return MeasuredProfile.fit(
            samples,
            meta,
            forward_terms=forward_terms(device, paths["linear"].startswith("onednn")),
            sample_terms=SAMPLE_TERMS,
            prepare_terms=PREPARE_TERMS,
            holdout=[p.name for p in grid if p.holdout],
            readback_s=readback,
            host=fit_host(host_rows, host_s),
        )

    profile = fit([s for run in measured for s in run])
    reference = (statistics.median(watch.grid_canaries), statistics.median(watch.grid_prefills))
    spread = {"measured": pass_spread(used, measured)}
    if drift == "probes":
        # The first fit's shape splits each step into the seconds that go with memory
        # bandwidth and those that go with arithmetic; each part is taken to the grid's
        # median state by its own probe, and the profile is fitted again on the result.
        steady = [at_reference(m, reference, profile.forward) for m in used]
        spread["steadied"] = pass_spread(used, steady)
        as_measured = profile.fit_report
        profile = fit([s for run in steady for s in run])
        for k in ("mape", "p90", "run_mape", "run_max"):
            key = f"forward_holdout_{k}"
            if key in as_measured:
                profile.fit_report[f"measured_{key}"] = as_measured[key]
    held = [s for m in used if m.point.holdout for s in m.host(readback)]
    pred = [profile.host.seconds(st.rows) for m in used if m.point.holdout for st in m.stats]
    if held:
        profile.fit_report["host_holdout_total_error"] = round(
            sum(pred) / max(sum(held), 1e-9) - 1, 5
        )
    report = profile.fit_report
    report["passes"] = passes
    report["drift"] = drift
    # How far a point's two passes disagreed (summed forward seconds, the median over the
    # points measured twice), as measured and as fitted: what the drift correction removed.
    for k, v in spread.items():
        if v is not None:
            report[f"pass_spread_{k}"] = round(v, 5)
    report["others_cpu_share_mean"] = round(statistics.mean(m.foreign for m in runs), 4)
    # A 1-row decode step (the canary's median) before and after: the machine's drift.
    report["canary_start_s"] = round(canary_start, 5)
    report["canary_end_s"] = round(canary_end, 5)
    # The quietest probes: the reference for a reader of profiles without the grid medians.
    report["canary_best_s"] = round(watch.best_canary, 5)
    report["prefill_canary_best_s"] = round(watch.best_prefill, 5)
    # The probes' medians over the grid (one pair after each point): the state the fit
    # describes, which sim_check --speed auto compares its own medians with.
    report["canary_grid_s"] = round(statistics.median(watch.grid_canaries), 5)
    report["prefill_canary_grid_s"] = round(statistics.median(watch.grid_prefills), 5)
    report["remeasured_points"] = watch.retries
    report["runs_left_out"] = len(runs) - len(used)
    report["waited_s"] = round(watch.waited_s, 1)
    profile.fit_report["calibration_s"] = round(time.perf_counter() - t0, 1)
    return profile, runs, base
