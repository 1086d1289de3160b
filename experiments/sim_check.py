"""Simulator validation: the same workloads on the real and the simulated executor, and how
far the simulated seconds land from the measured ones.

    python -m experiments.sim_check                            # SmolLM2 fp32, shipped profile
    python -m experiments.sim_check dtype=bfloat16 --host-time model
    python -m experiments.sim_check --quick --profile /tmp/tiny.yaml --repeats 1   # tiny model

One process, one loaded model. Each case (a workload under one scheduler x allocator x output
policy) is served by the real engine `--repeats` times (5) and by the simulated engine once,
built from the same config with `executor=simulated` (the shipped profile for this model x
dtype, or `--profile`; host time `measured` unless `--host-time model`). The simulated run
replays the tokens of the first real run of its case (`TokenStreams` with a replay, as
`executor.replay` does), so wherever a workload honours EOS its stops land where the model put
them; every workload here ignores EOS anyway.

`--speed auto` takes the machine's drift out and leaves the profile's own error: it simulates at
`executor.speed` = the profile's canary (the median of the probes taken between its grid points,
or in older profiles the quietest) over the median canary around the kept real
runs, and `executor.compute_speed` from a second probe, a 128-token prefill, for the forward's
compute-bound seconds (a shared VM's neighbours take memory bandwidth more than arithmetic, so
the two slow apart). The report tallies the same real runs against the one-scalar correction
(the decode canary's speed alone) and against the profile as shipped, too.

Workloads: `straggler` (the preset); `azure_closed`, the benchmark's queued Azure slice (its
own construction, `experiments.benchmark.azure_specs`: the first `--requests` rows, lengths
scaled to the caps, all at t=0); `azure_open`, the same requests as a seeded Poisson process at
each of `--loads` (0.5, 0.9) x the capacity the real reference runs measured on the queued
slice (requests/s, median); `tight_pool`, the queued slice through a pool of `--tight-blocks`
blocks (default: a third of what the slice needs at once) with incremental allocation, so
that requests are preempted and recomputed. Policies: every scheduler x allocator with
immediate output, plus continuous/incremental with deferred output at window 4, on
`straggler` and `azure_closed` (`--matrix-workloads`); the others under the reference policy
(continuous/incremental/immediate) alone. `--quick`: the tiny model, small sizes and three
policies.

The real runs alternate their order from round to round (forward, then backward, as in
`experiments/ab.py`), so that a slow spell of a shared machine spreads over every case rather
than falling on one. A shared VM also slows by itself: before and after each real run a canary
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
(`experiments/sim_twins.py`): closed-loop cases that took the same steps under other policies;
their real medians differ by the machine's noise alone, which the report measures so. Where
the seconds go (`sim_check_steps.csv` and the last table): each case's forward seconds by step
kind (prefill, decode, mixed), sampling and host time, real against predicted, to say which
steps a large error comes from.

The profile is fitted on the calibration grid only (`experiments/calibrate.py`); a profile whose
fitted grid holds a point shaped like a validation workload is named in the report. Writes
`sim_check.csv`, `sim_check.md`, `sim_check_steps.csv` and `sim_check_pairs.csv` (every
closed-loop step, its features, real and predicted seconds) to `--out`; one MLflow parent run
(`nanoserve.kind=sim_check`) with the files and a child run per case.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from experiments.analytic_profile import prefill_step
from experiments.benchmark import (
    DEFAULT_TRACE,
    Context,
    NullHooks,
    azure_specs,
    compose_cfg,
    open_loop,
    straggler_specs,
)
from experiments.machine_probe import cpu_seconds
from experiments.sim_twins import section as twins_section
from experiments.sim_twins import twin_rows
from framework.engine.counters import HOST_PHASES
from framework.engine.loop import RunResult
from framework.engine.request import RequestSpec
from framework.executors.packed_linear import rows_bucket
from framework.executors.simulated.cost import read_profile
from framework.executors.simulated.features import NAMES, StepFeatures
from framework.executors.simulated.load import load_cost_model
from framework.executors.simulated.tokens import TokenStreams
from framework.run.app import build_engine, check_before_loading, load, resolve_device
from framework.run.simulation import choose_profile
from framework.run.summary import summarize
from framework.tracking.store import TrackingStore
from framework.tracking.tables import markdown_table, write_csv
from framework.tracking.tags import environment_tags, flatten
from framework.workloads import build_workload

ROOT = Path(__file__).resolve().parents[1]
Combo = tuple[str, str, str]  # scheduler, allocator, output
REFERENCE: Combo = ("continuous", "incremental", "immediate")
DEFERRED: Combo = ("continuous", "incremental", "deferred")
SCHEDULERS = ("static", "continuous", "priority", "sjf")
ALLOCATORS = ("worst_case", "incremental")
WORKLOADS = ("straggler", "azure_closed", "azure_open", "tight_pool")
WINDOW = 4  # the deferred case's window
# The counts compared and shown (the summary's keys): on a closed loop they are the schedule's
# alone, so a simulation that runs the same engine must reproduce them exactly.
COUNTS = ("steps", "token_slots", "preemptions", "recomputed_tokens", "overshoot_tokens")
# Every count of the summary that a closed loop fixes; `window` is left out (an adaptive
# output policy reads it off measured seconds) as in tests/test_simulated.py.
SAME = ("requests_finished", "tokens_kept", "prefill_tokens", "peak_blocks", "transfers")
SAME += ("deferred_tokens", "abandoned_tokens", "max_preemptions_per_request")
# metric name -> (summary key, target: the largest |relative error| that meets it)
METRICS = {
    "makespan": ("makespan_s", 0.05),
    "throughput": ("output_tokens_per_s", 0.05),
    "ttft_p50": ("ttft_p50_s", 0.05),
    "ttft_p99": ("ttft_p99_s", 0.10),
    "tpot_p50": ("tpot_p50_s", 0.05),
    "tpot_p99": ("tpot_p99_s", 0.10),
    "e2e_p50": ("e2e_p50_s", 0.05),
    "e2e_p99": ("e2e_p99_s", 0.10),
}
COLUMNS = ("case", "workload", "scheduler", "allocator", "output", "closed_loop", "requests")
COLUMNS += ("real_runs", "counts_equal")
COLUMNS += tuple(f"{k}_{side}" for k in COUNTS for side in ("real", "sim"))
COLUMNS += tuple(
    f"{m}_{part}" for m in METRICS for part in ("real", "sim", "error", "spread", "verdict")
)
COLUMNS += (
    "e2e_mape",
    "others_cpu_max",
    "canary_slow",
    "prefill_slow",
    "retried_runs",
    "makespan_runs",
    "note",
)
KINDS = ("prefill", "decode", "mixed")
STEP_COLUMNS = ("case", "kind", "steps_real", "steps_sim", "forward_real_s", "forward_sim_s")
STEP_COLUMNS += ("forward_error", "forward_step_mape", "sample_real_s", "sample_sim_s")
STEP_COLUMNS += ("host_real_s", "host_sim_s", "host_error")
PAIR_COLUMNS = ("case", "step", "kind", *NAMES, "forward_real_s", "forward_sim_s")
PAIR_COLUMNS += ("sample_real_s", "sample_sim_s", "host_real_s", "host_sim_s")
# Under the user's overrides, as in the benchmark: invariant checks are host work a serving
# engine would not do on every step.
BASE = ["engine.check_invariants=false"]
# Five real runs a case: on the Zen 5 VM (2026-12-03) the five checks with three left 2-18
# cells of about 150 (median 7) outside both the targets and the real runs' spread, in other
# cases each time (three runs sample a shared VM's spells too thinly for a median or a
# spread), and the four checks with five 1, 0, 1 and 0 (docs/simulator-validation.md).
# Five take 5.4 min on SmolLM2.
FULL = {"requests": 24, "max_prompt": 128, "max_output": 32, "repeats": 5}
FULL |= {"max_foreign": 0.15, "max_slow": 0.1, "max_wait": 10.0}
# Quick runs are tests and smoke checks, on machines busy with other tests: no waiting.
QUICK = {"requests": 6, "max_prompt": 24, "max_output": 8, "repeats": 1}
QUICK |= {"max_foreign": 1.0, "max_slow": 1e9, "max_wait": 0.0}
MET, SPREAD, NOT_MET = "met", "within real spread", "not met"


# ---- cases --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    """One workload under one policy combination: served real `repeats` times, simulated once."""

    workload: str  # straggler, azure_closed, azure_open_0.5, tight_pool, ...
    combo: Combo
    closed: bool  # every request waiting from t=0: the counts must be equal
    extra: tuple[str, ...] = ()  # overrides beyond the combo (the tight pool's size)

    @property
    def name(self) -> str:
        policy = "/".join(self.combo)
        if self.combo[2] == "deferred":
            policy += f"-{WINDOW}"
        return f"{self.workload} {policy}"

    def overrides(self, base: list[str]) -> list[str]:
        s, a, o = self.combo
        window = [f"window={WINDOW}"] if o == "deferred" else []
        return [*base, f"scheduler={s}", f"allocator={a}", f"output={o}", *window, *self.extra]


def policy_combos(quick: bool) -> list[Combo]:
    """The reference first, then every scheduler x allocator with immediate output, then the
    deferred case; `--quick`: the reference, static/worst_case and the deferred case."""
    if quick:
        return [REFERENCE, ("static", "worst_case", "immediate"), DEFERRED]
    grid = [(s, a, "immediate") for s in SCHEDULERS for a in ALLOCATORS]
    return [REFERENCE, *(c for c in grid if c != REFERENCE), DEFERRED]


def closed_cases(args: argparse.Namespace, tight_blocks: int | None) -> list[Case]:
    cases = []
    for workload in ("straggler", "azure_closed"):
        if workload in args.workloads:
            combos = policy_combos(args.quick) if workload in args.matrix_workloads else [REFERENCE]
            cases += [Case(workload, c, True) for c in combos]
    if "tight_pool" in args.workloads:
        cases.append(Case("tight_pool", REFERENCE, True, (f"engine.num_blocks={tight_blocks}",)))
    return cases


def open_cases(args: argparse.Namespace) -> list[Case]:
    if "azure_open" not in args.workloads:
        return []
    return [Case(f"azure_open_{load:g}", REFERENCE, False) for load in args.loads]


def default_tight_blocks(specs: list[RequestSpec], block_size: int, max_num_seqs: int) -> int:
    """A third of the blocks the first `max_num_seqs` requests hold at their full length (what
    a batch would need at once), and never less than the largest request: every request fits
    alone, but not many together, so growing rows run the pool dry and preempt."""
    need = [-(-(len(s.prompt_token_ids) + s.sampling.max_tokens) // block_size) for s in specs]
    return max(max(need), math.ceil(sum(need[:max_num_seqs]) / 3))


# ---- running ------------------------------------------------------------------------------
@dataclasses.dataclass
class Runs:
    """A case's real runs and its simulated one."""

    case: Case
    specs: list[RequestSpec]
    real: list[RunResult] = dataclasses.field(default_factory=list)
    foreign: list[float] = dataclasses.field(default_factory=list)  # others' CPU, per real run
    slow: list[float] = dataclasses.field(default_factory=list)  # the canaries around each
    prefill_slow: list[float] = dataclasses.field(default_factory=list)  # the prefill probes
    retried: int = 0  # real runs measured again because others took the CPUs meanwhile
    sim: RunResult | None = None
    features: list[StepFeatures] = dataclasses.field(default_factory=list)  # the sim's steps
    # Other simulations of the same runs, by what the report calls them: at a `--speed`
    # other than 1, the profile as shipped; under `auto`, the one-scalar correction too.
    alts: dict[str, RunResult] = dataclasses.field(default_factory=dict)

    def median_real(self) -> RunResult:
        """The real run of median makespan: its counts and steps stand for the real side."""
        ranked = sorted(self.real, key=lambda r: summarize(r)["makespan_s"])
        return ranked[(len(ranked) - 1) // 2]


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the overrides of both sides, the simulator's own `executor.*` ones): the real
    executor refuses the simulator's settings rather than ignore them."""
    sim = [o for o in overrides if o.lstrip("+~").startswith("executor.")]
    bad = [o for o in overrides if o.lstrip("+~").startswith("executor=")]
    if bad:
        raise ValueError(f"{bad[0]}: the real side is the model and the other the simulator")
    return [o for o in overrides if o not in sim], sim


def sim_overrides(sim: list[str], profile: str | None, host_time: str | None) -> list[str]:
    """The simulated side's overrides: `--profile` and `--host-time` after the user's own
    `executor.*` ones, which they override when given."""
    out = ["executor=simulated", *sim]
    if profile:
        out.append(f"executor.profile={profile}")
    return [*out, f"executor.host_time={host_time}"] if host_time else out


@dataclasses.dataclass
class Setup:
    """What every run shares: the loaded model, its simulated shape, the simulator's
    settings (the profile resolved to its file)."""

    ctx: Context
    shape: Any  # ModelShape: the model's config and EOS, no weights
    sim: list[str]  # the simulated side's overrides, after the shared ones

    def real_cfg(self, case: Case) -> DictConfig:
        return compose_cfg(case.overrides(self.ctx.overrides))

    def sim_cfg(self, case: Case, extra: list[str] | None = None) -> DictConfig:
        return compose_cfg(case.overrides([*self.ctx.overrides, *self.sim, *(extra or [])]))


def serve_real(setup: Setup, case: Case, specs: list[RequestSpec]) -> RunResult:
    c = setup.ctx
    engine = build_engine(setup.real_cfg(case), c.model, c.device, c.dtype, NullHooks())
    return engine.run(specs, c.tok.eos_token_id)


class FeatureRecorder:
    """The simulated executor, each step's features kept (for the per-step table). Its own
    work, like the prediction's, is outside the virtual clock, which is frozen during the
    call, so recording costs the simulated run nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads_slots = getattr(inner, "reads_slots", True)
        self.features: list[StepFeatures] = []

    def describe(self) -> dict[str, str]:
        return dict(self.inner.describe())

    def execute(self, batch: Any) -> Any:
        self.features.append(StepFeatures.of(batch))
        return self.inner.execute(batch)


def serve_sim(
    setup: Setup,
    case: Case,
    specs: list[RequestSpec],
    replay: dict[str, list[int]] | None,
    speed: float = 1.0,
    compute_speed: float | None = None,
) -> tuple[RunResult, list[StepFeatures]]:
    """The simulated engine of the same config (at `executor.speed=speed` and
    `executor.compute_speed`), and each step's features; with `replay`, the given tokens by
    request."""
    # An override, not an assignment: a composed config can share nodes with the next one
    # composed from the same overrides, so setting a field would leak into later runs.
    extra = [f"executor.speed={speed!r}"] if speed != 1 else []
    if compute_speed is not None:
        extra.append(f"executor.compute_speed={compute_speed!r}")
    cfg = setup.sim_cfg(case, extra)
    engine = build_engine(cfg, setup.shape, torch.device("cpu"), setup.ctx.dtype, NullHooks())
    if replay is not None:
        x = cfg.executor
        streams = TokenStreams(
            setup.shape.config.vocab_size,
            setup.shape.eos_token_id,
            replay,
            float(x.mean_output_tokens),
        )
        streams.check_covers([s.id for s in specs])
        engine.executor.tokens = streams
    recorder = FeatureRecorder(engine.executor)
    engine.executor = recorder
    return engine.run(specs, setup.ctx.tok.eos_token_id), recorder.features


def others_share(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """The share of all CPUs that other processes used between two `cpu_seconds()`."""
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others) / (max(wall, 1e-9) * (os.cpu_count() or 1))


PREFILL_PROBE = 128  # the prefill probe's prompt tokens (experiments/calibrate.py's too)


class Machine:
    """How this machine is doing, beside each real run: other processes' share of the CPUs
    (from /proc/stat), and two probes, since a VM's neighbours can take memory bandwidth
    without showing there, timed before and after each real run:

    - the canary, one request's five 1-row decode steps (every weight read once, as
      bandwidth-bound as a step gets). Its slowdown is against the canary the profile
      recorded at calibration (the same probe as experiments/calibrate.py's): the median of
      the probes taken between its grid points (`fit.canary_grid_s`), the state the fit
      describes, measured with the statistic taken here; in profiles older than that, the
      quietest probe (`fit.canary_best_s`); else the quietest seen here;
    - the prefill probe, one 128-token prompt's prefill (mostly the Linear layers'
      arithmetic), against `fit.prefill_canary_grid_s`, else `fit.prefill_canary_best_s`,
      else the profile's own prediction of that step.

    Why the grid's median and not the quietest: one probe varies by a fifth, so the
    quietest of a few is far below their median, and a median around the real runs set
    against it reads a slowdown on a machine in the very state it was profiled in. Measured
    on 2026-12-01 (fp32, a profile calibrated minutes before): the quietest probe put the
    machine 19% slower than its profile (speed 0.81), while the profile as shipped met 16
    of 21 makespans within 5% (docs/simulator-validation.md).
    """

    def __init__(self, setup: Setup, profile: str) -> None:
        self.setup = setup
        fit = read_profile(profile).get("fit") or {}
        grid, best = fit.get("canary_grid_s"), fit.get("canary_best_s")
        reference = grid or best
        self.reference_s = float(reference) if reference else None  # the canary's reference
        self.reference = "the profile's grid median" if grid else "the profile's quietest"
        self.best_s = float("inf")
        self.seen: list[float] = []
        c = setup.ctx
        wl = {"kind": "fixed", "prompt_lens": [16], "output_lens": [6], "seed": c.cfg.seed}
        self.specs = build_workload(wl, c.tok)
        self.case = Case("canary", REFERENCE, True, ("engine.max_num_seqs=1",))
        n = PREFILL_PROBE
        wl = {"kind": "fixed", "prompt_lens": [n], "output_lens": [1], "seed": c.cfg.seed}
        self.prefill_specs = build_workload(wl, c.tok)
        # as the packed Linear layers pad it on this CPU
        step = dataclasses.replace(prefill_step(n), linear_tokens=rows_bucket(n))
        # The probe as the profile predicts it at speed 1: all of it, and its compute share.
        cost = load_cost_model(profile).predict(step)
        self.prefill_predicted = (cost.forward_s, cost.compute_s)
        grid, best = fit.get("prefill_canary_grid_s"), fit.get("prefill_canary_best_s")
        self.prefill_reference_s = float(grid or best or cost.forward_s)
        self.prefill_reference = (
            "the profile's grid median"
            if grid
            else "the profile's quietest probe"
            if best
            else "the profile's prediction"
        )
        self.prefill_seen: list[float] = []

    def canary_s(self) -> float:
        got = serve_real(self.setup, self.case, self.specs)
        secs = statistics.median(
            st.phase_s.get("forward", 0.0) for st in got.steps if st.prefill_rows == 0
        )
        self.best_s = min(self.best_s, secs)
        self.seen.append(secs)
        return secs

    def prefill_s(self) -> float:
        got = serve_real(self.setup, self.case, self.prefill_specs)
        secs = sum(st.phase_s.get("forward", 0.0) for st in got.steps if st.decode_rows == 0)
        self.prefill_seen.append(secs)
        return secs

    def probes(self) -> tuple[float, float]:
        """(the canary's decode step, the prefill probe's step), seconds."""
        return self.canary_s(), self.prefill_s()

    def slow(self, secs: float) -> float:
        """A canary step's seconds over the reference's, minus 1."""
        return secs / (self.reference_s or self.best_s) - 1

    def prefill_slow(self, secs: float) -> float:
        return secs / self.prefill_reference_s - 1

    def compute_speed(self, speed: float, prefill_slow: float) -> float | None:
        """The compute speed that, with the memory-bound seconds at `speed`, predicts the
        prefill probe as slow as measured: probe = M / speed + C / compute_speed, the
        profile's split of it at speed 1 scaled by the probe's slowdown. None when the
        profile puts none of the probe on compute (nothing to divide apart)."""
        total, compute = self.prefill_predicted
        if compute <= 0:
            return None
        inverse = ((1 + prefill_slow) * total - (total - compute) / speed) / compute
        return 1 / max(inverse, 0.2)  # never more than 5x the profile's machine

    def wait_quiet(self, max_foreign: float, max_slow: float, max_wait_s: float) -> None:
        """Wait (at most `max_wait_s`) until the others leave the CPUs to us and the canary
        is back within `max_slow` of the quiet one."""
        end = time.perf_counter() + max_wait_s
        while time.perf_counter() < end:
            t, before = time.perf_counter(), cpu_seconds()
            time.sleep(0.5)
            if others_share(before, cpu_seconds(), time.perf_counter() - t) > max_foreign:
                continue
            if self.slow(self.canary_s()) <= max_slow:
                return


@dataclasses.dataclass
class Measured:
    result: RunResult
    foreign: float  # other processes' share of the CPUs during the run
    slow: float  # the canary's slowdown around it
    prefill_slow: float  # the prefill probe's

    def badness(self, max_foreign: float, max_slow: float) -> float:
        """Above 1: measured while the machine was not as quiet as asked."""
        return max(self.foreign / max_foreign, self.slow / max_slow)


def timed_real(machine: Machine, case: Case, specs: list[RequestSpec]) -> Measured:
    """One real run, bracketed by the probes before and after it: one probe varies by a
    fifth from one to the next on a shared VM, so the run's slowdowns are the two's means."""
    ahead = machine.probes()
    t, before = time.perf_counter(), cpu_seconds()
    got = serve_real(machine.setup, case, specs)
    foreign = others_share(before, cpu_seconds(), time.perf_counter() - t)
    after = machine.probes()
    return Measured(
        got,
        foreign,
        machine.slow((ahead[0] + after[0]) / 2),
        machine.prefill_slow((ahead[1] + after[1]) / 2),
    )


def rounds(
    machine: Machine,
    runs: list[Runs],
    args: argparse.Namespace,
    tick: Callable[[str], None],
) -> tuple[float, float | None]:
    """Every case's real runs, the order reversed each round, then each case's simulation
    (replaying its first real run's tokens); the simulated machine's speeds it used
    (`executor.speed`, `executor.compute_speed`). A real
    run during which other processes took more than `--max-foreign` of the CPUs, or after
    which the canary was more than `--max-slow` above the quiet one, is run again once, after
    waiting (up to `--max-wait` seconds) for the machine to quieten, and the less disturbed
    of the two is kept."""
    bounds = (args.max_foreign, args.max_slow)
    for rnd in range(args.repeats):
        order = runs if rnd % 2 == 0 else runs[::-1]
        for r in order:
            got = timed_real(machine, r.case, r.specs)
            if got.badness(*bounds) > 1:
                machine.wait_quiet(*bounds, args.max_wait)
                again = timed_real(machine, r.case, r.specs)
                r.retried += 1
                got = min(got, again, key=lambda m: m.badness(*bounds))
            r.real.append(got.result)
            r.foreign.append(got.foreign)
            r.slow.append(got.slow)
            r.prefill_slow.append(got.prefill_slow)
            tick(
                f"real {rnd + 1}/{args.repeats}  {r.case.name:48s} {makespan(got.result):8.3f} s"
                f"  others' CPU {got.foreign:4.0%}  canary {got.slow:+4.0%}"
                f"  prefill {got.prefill_slow:+4.0%}"
            )
    speed = sim_speed(args.speed, [s for r in runs for s in r.slow])
    compute = None
    if args.speed == "auto":
        prefill = [s for r in runs for s in r.prefill_slow]
        compute = machine.compute_speed(speed, statistics.median(prefill)) if prefill else None
    setup = machine.setup
    for r in runs:
        replay = {s.id: list(s.output_token_ids) for s in r.real[0].seqs}
        r.sim, r.features = serve_sim(setup, r.case, r.specs, replay, speed, compute)
        if compute is not None:
            r.alts[SCALAR] = serve_sim(setup, r.case, r.specs, replay, speed)[0]
            own = sim_speed("auto", r.slow)
            own_compute = machine.compute_speed(own, statistics.median(r.prefill_slow))
            r.alts[OWN] = serve_sim(setup, r.case, r.specs, replay, own, own_compute)[0]
        if speed != 1 or compute is not None:
            r.alts[SHIPPED] = serve_sim(setup, r.case, r.specs, replay)[0]
        tick(f"sim         {r.case.name:48s} {makespan(r.sim):8.3f} s")
    return speed, compute


SCALAR = "the decode canary's speed alone (one scalar, executor.speed)"
SHIPPED = "the profile as shipped (speed 1)"
# The machine drifts within a check: around single runs the decode canary read -17% to +51%
# of the profile's on the Zen 5 VM (docs/simulator-validation.md). The probes around each
# case's own runs say how fast the machine was while that case ran.
OWN = "each case's own probes (executor.speed and compute_speed from its runs alone)"


def sim_speed(asked: str, slowdowns: list[float]) -> float:
    """`--speed`: a number, or `auto`: the profile's canary over the median canary around the
    kept real runs being simulated (1 / (1 + their median slowdown)). A scalar from a
    probe that is not a validation workload, so the profile's shape is still what is
    tested; it takes out only how much slower the machine's memory ran than when profiled
    (the compute side: `Machine.compute_speed`)."""
    if asked != "auto":
        return float(asked)
    return 1.0 / (1.0 + statistics.median(slowdowns)) if slowdowns else 1.0


def makespan(result: RunResult) -> float:
    return float(summarize(result)["makespan_s"])


# ---- rows ---------------------------------------------------------------------------------
def rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return sim / real - 1


def verdict(error: float | None, spread: float | None, target: float) -> str:
    """`met` within the target; else `within real spread` when the real runs themselves
    moved more than the error; else `not met`."""
    if error is None:
        return "-"
    if abs(error) <= target:
        return MET
    if spread is not None and abs(error) <= spread:
        return SPREAD
    return NOT_MET


def e2e_by_request(result: RunResult) -> dict[str, float]:
    return {s.id: s.finished_at - s.arrival for s in result.seqs if s.finished_at is not None}


def e2e_mape(real: list[RunResult], sim: RunResult) -> float | None:
    """Mean over requests of |sim e2e - real e2e| / real e2e, the real e2e being the median
    over the real runs of that request's."""
    per = [e2e_by_request(r) for r in real]
    got = e2e_by_request(sim)
    errors = []
    for rid, value in got.items():
        seen = [p[rid] for p in per if rid in p]
        if seen:
            ref = statistics.median(seen)
            if ref > 0:
                errors.append(abs(value - ref) / ref)
    return statistics.mean(errors) if errors else None


def counts_of(result: RunResult) -> dict[str, Any]:
    s = summarize(result)
    return {k: s[k] for k in (*COUNTS, *SAME)}


def make_row(r: Runs) -> dict[str, Any]:
    assert r.sim is not None
    case = r.case
    real_counts = [counts_of(x) for x in r.real]
    sim_counts = counts_of(r.sim)
    shown = counts_of(r.median_real())
    row: dict[str, Any] = {"case": case.name, "workload": case.workload}
    row |= dict(zip(("scheduler", "allocator", "output"), case.combo, strict=True))
    row |= {"closed_loop": case.closed, "requests": len(r.specs), "real_runs": len(r.real)}
    row["counts_equal"] = all(c == sim_counts for c in real_counts)
    notes = []
    if case.closed and any(c != real_counts[0] for c in real_counts):
        notes.append("the real runs' counts differ among themselves")
    for k in COUNTS:
        row[f"{k}_real"], row[f"{k}_sim"] = shown[k], sim_counts[k]
    summaries = [summarize(x) for x in r.real]
    sim = summarize(r.sim)
    for name, (key, target) in METRICS.items():
        values = [s[key] for s in summaries if s[key] is not None]
        real = statistics.median(values) if values else None
        spread = (max(values) - min(values)) / real if values and real else None
        error = rel(sim[key], real)
        row |= {f"{name}_real": real, f"{name}_sim": sim[key], f"{name}_error": error}
        row |= {f"{name}_spread": spread if len(values) > 1 else None}
        row[f"{name}_verdict"] = verdict(error, spread if len(values) > 1 else None, target)
    row["e2e_mape"] = e2e_mape(r.real, r.sim)
    row["others_cpu_max"] = max(r.foreign) if r.foreign else None
    row["canary_slow"] = statistics.median(r.slow) if r.slow else None
    row["prefill_slow"] = statistics.median(r.prefill_slow) if r.prefill_slow else None
    row["makespan_runs"] = " ".join(f"{makespan(x):.4f}" for x in r.real)
    row["retried_runs"] = r.retried
    if case.workload == "tight_pool" and not shown["preemptions"]:
        notes.append("the tight pool did not preempt: lower --tight-blocks")
    row["note"] = "; ".join(notes)
    return row


def kind(st: Any) -> str:
    if st.decode_rows == 0:
        return "prefill"
    return "decode" if st.prefill_rows == 0 else "mixed"


def host_s(st: Any) -> float:
    """The engine's own seconds in a step (the executor's block tables included, in
    `build`), or, under modelled host time, the modelled cost."""
    return sum(st.phase_s.get(p, 0.0) for p in (*HOST_PHASES, "host"))


def step_rows(r: Runs) -> list[dict[str, Any]]:
    """Where the seconds go: per step kind (and all), the real median run against the
    simulation. On a closed loop the steps pair one to one (the same schedule), which gives
    each kind's per-step forward MAPE too."""
    assert r.sim is not None
    real, sim = r.median_real().steps, r.sim.steps
    same = paired(r)
    out = []
    for k in (*KINDS, "all"):
        a = [st for st in real if k in ("all", kind(st))]
        b = [st for st in sim if k in ("all", kind(st))]
        if not a and not b:
            continue
        fa = sum(st.phase_s.get("forward", 0.0) for st in a)
        fb = sum(st.phase_s.get("forward", 0.0) for st in b)
        ha, hb = sum(host_s(st) for st in a), sum(host_s(st) for st in b)
        mape = None
        if same:
            pairs = [
                (x.phase_s.get("forward", 0.0), y.phase_s.get("forward", 0.0))
                for x, y in zip(real, sim, strict=True)
                if k in ("all", kind(x))
            ]
            errs = [abs(y / x - 1) for x, y in pairs if x > 0]
            mape = statistics.mean(errs) if errs else None
        out.append(
            {
                "case": r.case.name,
                "kind": k,
                "steps_real": len(a),
                "steps_sim": len(b),
                "forward_real_s": fa,
                "forward_sim_s": fb,
                "forward_error": rel(fb, fa),
                "forward_step_mape": mape,
                "sample_real_s": sum(st.phase_s.get("sample", 0.0) for st in a),
                "sample_sim_s": sum(st.phase_s.get("sample", 0.0) for st in b),
                "host_real_s": ha,
                "host_sim_s": hb,
                "host_error": rel(hb, ha),
            }
        )
    return out


def paired(r: Runs) -> bool:
    """The real median run and the simulation took the same steps (a closed loop does)."""
    assert r.sim is not None
    real, sim = r.median_real().steps, r.sim.steps
    return r.case.closed and [kind(a) for a in real] == [kind(b) for b in sim]


def pair_rows(r: Runs) -> list[dict[str, Any]]:
    """Every step of a closed-loop case: its features, and the real median run's seconds
    beside the predicted ones (for refitting or diagnosing by hand)."""
    if not paired(r):
        return []
    assert r.sim is not None
    out = []
    for i, (a, b, f) in enumerate(zip(r.median_real().steps, r.sim.steps, r.features, strict=True)):
        out.append(
            {
                "case": r.case.name,
                "step": i,
                "kind": kind(a),
                **f.as_dict(),
                "forward_real_s": a.phase_s.get("forward", 0.0),
                "forward_sim_s": b.phase_s.get("forward", 0.0),
                "sample_real_s": a.phase_s.get("sample", 0.0),
                "sample_sim_s": b.phase_s.get("sample", 0.0),
                "host_real_s": host_s(a),
                "host_sim_s": host_s(b),
            }
        )
    return out


# ---- the run ------------------------------------------------------------------------------
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
        specs["straggler"] = straggler_specs(ctx)
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


# ---- the report ---------------------------------------------------------------------------
def pct(v: float | None, signed: bool = True) -> str:
    if v is None:
        return "-"
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"


def num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def counts_cell(row: dict[str, Any], k: str) -> str:
    a, b = row[f"{k}_real"], row[f"{k}_sim"]
    return str(a) if a == b else f"{a} / {b}"


def metric_cell(row: dict[str, Any], m: str) -> str:
    """`real / sim, error (spread) verdict` in one cell."""
    v = row[f"{m}_verdict"]
    short = {MET: "met", SPREAD: "in spread", NOT_MET: "**not met**"}.get(v, v)
    return (
        f"{num(row[f'{m}_real'])} / {num(row[f'{m}_sim'])}, {pct(row[f'{m}_error'])} "
        f"({pct(row[f'{m}_spread'], False)}) {short}"
    )


def tallies(rows: list[dict[str, Any]]) -> list[str]:
    """One line per target: how many cases met it."""
    closed = [r for r in rows if r["closed_loop"]]
    lines = [
        f"- closed-loop counts identical: {sum(r['counts_equal'] for r in closed)} of "
        f"{len(closed)} cases"
    ]
    for m, (_, target) in METRICS.items():
        got = [r[f"{m}_verdict"] for r in rows if r[f"{m}_verdict"] != "-"]
        lines.append(
            f"- {m} within {target:.0%}: {got.count(MET)} met, {got.count(SPREAD)} within the "
            f"real spread, {got.count(NOT_MET)} not met (of {len(got)})"
        )
    mapes = [r["e2e_mape"] for r in rows if r["e2e_mape"] is not None]
    if mapes:
        lines.append(
            f"- per-request e2e MAPE: median {pct(statistics.median(mapes), False)}, "
            f"max {pct(max(mapes), False)}"
        )
    return lines


def write(
    out: Path,
    rows: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    pairs: list[dict[str, Any]],
    header: dict[str, str],
    alts: dict[str, list[dict[str, Any]]] | None = None,
    twins: list[dict[str, Any]] | None = None,
) -> tuple[Path, ...]:
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "sim_check.csv", out / "sim_check.md", out / "sim_check_steps.csv")
    paths += (out / "sim_check_pairs.csv",)
    write_csv(rows, COLUMNS, paths[0])
    write_csv(steps, STEP_COLUMNS, paths[2])
    write_csv(pairs, PAIR_COLUMNS, paths[3])
    lines = ["# nanoserve simulator check", "", *[f"- {k}: {v}" for k, v in header.items()]]
    lines += ["", "## Targets", "", *tallies(rows)]
    for label, alt in (alts or {}).items():
        lines += ["", f"The same real runs against {label}:", ""]
        lines += tallies(alt)
    lines += ["", *twins_section(twins or [], rows, list(METRICS), NOT_MET)]
    counts = [
        {
            "case": r["case"],
            "closed loop": "yes" if r["closed_loop"] else "no",
            "counts equal": "yes" if r["counts_equal"] else "**no**",
            **{k: counts_cell(r, k) for k in COUNTS},
        }
        for r in rows
    ]
    lines += ["", "## Counts (real / sim where they differ)", ""]
    lines.append(markdown_table(counts, ["case", "closed loop", "counts equal", *COUNTS]))
    lines += [
        "",
        "## Times",
        "",
        "Each cell: real (median of the runs) / simulated, relative error (the real runs' "
        "spread, (max - min) / median), verdict. Seconds; throughput in output tokens/s. "
        "Others' CPU: the largest share of the CPUs other processes took during a kept real "
        "run of the case; canary and prefill: the median slowdowns of the 1-row decode probe "
        "and of the prefill probe around its kept real runs, against the profile's.",
        "",
    ]
    times = [
        {
            "case": r["case"],
            **{m: metric_cell(r, m) for m in METRICS},
            "e2e MAPE": pct(r["e2e_mape"], False),
            "others' CPU": pct(r["others_cpu_max"], False),
            "canary": pct(r["canary_slow"]),
            "prefill": pct(r["prefill_slow"]),
        }
        for r in rows
    ]
    columns = ["case", *METRICS, "e2e MAPE", "others' CPU", "canary", "prefill"]
    lines.append(markdown_table(times, columns))
    lines += [
        "",
        "## Where the seconds go",
        "",
        "Per step kind, the real median run against the simulation: forward seconds (total, "
        "its error, and on a closed loop the mean per-step |error|), sampling, host.",
        "",
    ]
    shown = [
        {
            "case": s["case"],
            "kind": s["kind"],
            "steps": s["steps_real"]
            if s["steps_real"] == s["steps_sim"]
            else f"{s['steps_real']} / {s['steps_sim']}",
            "forward s real / sim": f"{num(s['forward_real_s'])} / {num(s['forward_sim_s'])}",
            "forward error": pct(s["forward_error"]),
            "per-step MAPE": pct(s["forward_step_mape"], False),
            "sample s real / sim": f"{num(s['sample_real_s'])} / {num(s['sample_sim_s'])}",
            "host s real / sim": f"{num(s['host_real_s'])} / {num(s['host_sim_s'])}",
            "host error": pct(s["host_error"]),
        }
        for s in steps
    ]
    lines.append(markdown_table(shown, list(shown[0]) if shown else ["case"]))
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def headline(
    rows: list[dict[str, Any]], twins: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """The parent run's metrics: the tallies, each case's errors, and how far apart the
    twins' real medians lie (the machine's noise in a median, `experiments/sim_twins.py`)."""
    closed = [r for r in rows if r["closed_loop"]]
    out: dict[str, float] = {
        "cases": len(rows),
        "closed_counts_equal": sum(r["counts_equal"] for r in closed),
        "closed_cases": len(closed),
    }
    for m in METRICS:
        got = [r[f"{m}_verdict"] for r in rows]
        out[f"{m}_met"] = got.count(MET)
        out[f"{m}_within_spread"] = got.count(SPREAD)
        out[f"{m}_not_met"] = got.count(NOT_MET)
        errs = [abs(r[f"{m}_error"]) for r in rows if r[f"{m}_error"] is not None]
        if errs:
            out[f"{m}_abs_error_max"] = max(errs)
        gaps = [t[f"{m}_apart"] for t in twins or [] if t[f"{m}_apart"] is not None]
        if gaps:
            out[f"{m}_twins_apart_max"] = max(gaps)
    out["twin_sets"] = len(twins or [])
    return out


def case_metrics(row: dict[str, Any]) -> dict[str, float]:
    keep = [c for c in COLUMNS if c.endswith(("_real", "_sim", "_error", "_spread"))]
    out = {k: float(row[k]) for k in keep if isinstance(row[k], int | float) and row[k] is not None}
    out["counts_equal"] = float(row["counts_equal"])
    if row["e2e_mape"] is not None:
        out["e2e_mape"] = row["e2e_mape"]
    return out


def log_mlflow(
    cfg: DictConfig,
    args: argparse.Namespace,
    files: Sequence[Path],
    rows: list[dict[str, Any]],
    header: dict[str, str],
    twins: list[dict[str, Any]],
) -> None:
    """One parent run (`nanoserve.kind=sim_check`) with the tables, and a child per case with
    its numbers. A failing store costs nothing: the files are already written."""
    store = TrackingStore(cfg.mlflow)
    kind = "sim_check"
    tags = {**environment_tags(), "mlflow.source.name": "experiments/sim_check.py"}
    parent = store.start_run(kind, tags | {"nanoserve.kind": kind})
    if parent is not None:
        params = flatten(OmegaConf.to_container(cfg, resolve=True), skip=["mlflow", "workload"])
        params |= {f"{kind}.{k}": str(v) for k, v in vars(args).items()}
        params |= {f"{kind}.{re.sub(r'[^A-Za-z0-9_.-]+', '_', k)}": v for k, v in header.items()}
        store.log_params(parent, params)
        store.log_summary(parent, headline(rows, twins))
        store.log_files(parent, files)
        for row in rows:
            child_tags = tags | {"nanoserve.kind": f"{kind}_case", "sim_check.case": row["case"]}
            child = store.start_run(row["case"], child_tags, parent=parent)
            if child is None:
                break
            store.log_params(
                child,
                {c: str(row[c]) for c in ("workload", "scheduler", "allocator", "output")}
                | {f"verdict.{m}": row[f"{m}_verdict"] for m in METRICS},
            )
            store.log_summary(child, case_metrics(row))
            store.end_run(child)
        store.end_run(parent)
    if store.broken is not None:
        where = f"results are in {files[0].parent}"
        print(f"MLflow: not logged: {store.broken}; {where}", file=sys.stderr)
    else:
        print(f"MLflow: logged run {parent} to {store.uri}")


# ---- command line -------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
        def split(text: str) -> list[str]:
            got = [x for x in text.split(",") if x]
            bad = [x for x in got if x not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad[0]!r}: choose from {', '.join(allowed)}")
            return got

        return split

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
    ap.add_argument("--requests", type=int, help="Azure slice: first N rows (24; quick 6)")
    ap.add_argument("--max-prompt", type=int, help="prompt tokens cap (128; quick 24)")
    ap.add_argument("--max-output", type=int, help="output tokens cap (32; quick 8)")
    ap.add_argument("--fit", choices=("scale", "clamp"), default="scale")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeats", type=int, help="real runs per case, median reported (5; quick 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
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
    ap.add_argument("--quick", action="store_true", help="tiny model, small sizes, three policies")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "sim_check")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run config")
    args = ap.parse_args(argv)
    if args.speed == "auto" and args.max_slow is None:
        # The probes set the simulated machine's speed: a run is not retried for being slow
        # (only for others taking the CPUs), which would spend minutes on a slow VM for
        # nothing.
        args.max_slow = 1e9
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.max_foreign <= 0 or args.max_slow <= 0:
        ap.error("--max-foreign and --max-slow must be > 0 (1 and a large number: never)")
    if any(x <= 0 for x in args.loads):
        ap.error(f"--loads must be positive shares of capacity, got {args.loads}")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    overrides = [*BASE, *(["model=tiny"] if args.quick else []), *args.overrides]
    threads = torch.get_num_threads()
    shared = [o for o in overrides if not o.lstrip("+~").startswith("executor.")]
    torch.set_num_threads(args.threads or compose_cfg(shared).threads or threads)
    t0, load_start = time.perf_counter(), os.getloadavg()[0]  # other jobs skew every time
    console = Console(stderr=True)
    try:
        runs, notes = sim_check(
            args, overrides, lambda line: console.print(line, highlight=False, soft_wrap=True)
        )
        threads_used = torch.get_num_threads()
    except ValueError as err:
        sys.exit(f"experiments.sim_check: {err}")
    finally:
        torch.set_num_threads(threads)  # a caller in the same process keeps its setting
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
    command = " ".join(
        ["python -m experiments.sim_check", *(sys.argv[1:] if argv is None else argv)]
    )
    data = read_profile(notes["profile"])
    meta, fit = data.get("meta") or {}, data.get("fit") or {}
    header = {
        "command": f"`{command}`",
        "model": f"{cfg.model.source}, {cfg.dtype}, {resolve_device(cfg.device)}, "
        f"{threads_used} threads",
        "engine": f"max_num_seqs {cfg.engine.max_num_seqs}, block_size {cfg.engine.block_size}",
        "real side": f"median of {args.repeats} run(s) per case, order alternating by round",
        "simulated side": f"one run per case, host time {notes.pop('host time')}, the first "
        "real run's tokens replayed",
        **notes,
        "profile made": f"{meta.get('date', '?')} on {(meta.get('machine') or {}).get('cpu', '?')}"
        f", commit {str(meta.get('commit', '?'))[:10]}",
        "profile fit": "forward, held-out grid points: per step MAPE "
        f"{pct(fit.get('forward_holdout_mape'), False)}, per run "
        f"{pct(fit.get('forward_holdout_run_mape'), False)}",
        "machine": f"{env['machine.cpu']}, {os.cpu_count()} cores, load average "
        f"{load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        "commit": f"{env['git.commit'][:10]} (dirty: {env['git.dirty']})",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "wall time": f"{time.perf_counter() - t0:.1f} s",
    }
    twins = twin_rows(runs, rows, list(METRICS))
    files = write(args.out, rows, steps, pairs, header, alts, twins)
    print(files[1].read_text())
    log_mlflow(cfg, args, files, rows, header, twins)
    print(f"results in {args.out}")
    return args.out


if __name__ == "__main__":
    main()
