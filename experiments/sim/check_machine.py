"""How the machine is doing beside each real run of a simulator check, and the rounds that
take the real runs, then simulate each case at the speeds the probes read."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

from experiments.sim.check_cases import Case
from experiments.sim.check_sides import Runs, Setup, makespan, serve_real, serve_sim
from experiments.toolkit.config import REFERENCE
from framework.calibration.analytic_profile import prefill_step
from framework.calibration.grid import CANARY, PREFILL_CANARY, workload
from framework.calibration.machine_load import cpu_seconds, foreign_share
from framework.core.request import RequestSpec
from framework.engine.loop import RunResult
from framework.executors.packed_linear import rows_bucket
from framework.executors.simulated.cost import read_profile
from framework.executors.simulated.load import load_cost_model
from framework.workloads import build_workload

PREFILL_PROBE = PREFILL_CANARY.prompt_lens[0]  # the prefill probe's prompt tokens


class Machine:
    """How this machine is doing, beside each real run: other processes' share of the CPUs
    (from /proc/stat), and two probes, since a VM's neighbours can take memory bandwidth
    without showing there, timed before and after each real run:

    - the canary, one request's five 1-row decode steps (every weight read once, as
      bandwidth-bound as a step gets). Its slowdown is against the canary the profile
      recorded at calibration (the same probe, `grid.CANARY`): the median of the probes
      taken between its grid points (`fit.canary_grid_s`), the state the fit describes,
      measured with the statistic taken here; in a profile without it, the quietest probe
      (`fit.canary_best_s`); else the quietest seen here;
    - the prefill probe, one 128-token prompt's prefill (mostly the Linear layers'
      arithmetic), against `fit.prefill_canary_grid_s`, else `fit.prefill_canary_best_s`,
      else the profile's own prediction of that step.

    Why the grid's median and not the quietest: one probe varies by a fifth, so the
    quietest of a few is far below their median, and a median around the real runs set
    against it reads a slowdown on a machine in the very state it was profiled in
    (docs/simulator-validation.md).
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
        self.specs = build_workload(workload(CANARY, c.cfg.seed), c.tok)
        self.case = Case("canary", REFERENCE, True, ("engine.max_num_seqs=1",))
        n = PREFILL_PROBE
        self.prefill_specs = build_workload(workload(PREFILL_CANARY, c.cfg.seed), c.tok)
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
            if foreign_share(before, cpu_seconds(), time.perf_counter() - t) > max_foreign:
                continue
            if self.slow(self.canary_s()) <= max_slow:
                return


@dataclasses.dataclass
class TimedRun:
    """One real run and how disturbed the machine was around it."""

    result: RunResult
    foreign: float  # other processes' share of the CPUs during the run
    slow: float  # the canary's slowdown around it
    prefill_slow: float  # the prefill probe's

    def badness(self, max_foreign: float, max_slow: float) -> float:
        """Above 1: measured while the machine was not as quiet as asked."""
        return max(self.foreign / max_foreign, self.slow / max_slow)


def timed_real(machine: Machine, case: Case, specs: list[RequestSpec]) -> TimedRun:
    """One real run, bracketed by the probes before and after it: one probe varies by a
    fifth from one to the next on a shared VM, so the run's slowdowns are the two's means."""
    ahead = machine.probes()
    t, before = time.perf_counter(), cpu_seconds()
    got = serve_real(machine.setup, case, specs)
    foreign = foreign_share(before, cpu_seconds(), time.perf_counter() - t)
    after = machine.probes()
    return TimedRun(
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
    for rnd in range(args.rounds):
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
                f"real {rnd + 1}/{args.rounds}  {r.case.name:48s} {makespan(got.result):8.3f} s"
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
# The machine drifts within a check (docs/simulator-validation.md): the probes around each
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
