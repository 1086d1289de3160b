"""The machine watched while the grid is measured (`MachineWatch`): other processes' work
kept out of the measurements, and probes of the machine's own state timed between the grid
points, whose medians are the state the fit is taken to."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from framework.calibration.grid import CANARY, PREFILL_CANARY, Point
from framework.calibration.machine_load import others_share
from framework.calibration.point_run import PointRun


class MachineWatch:
    """Keeps other processes' work out of the measurements, and probes the machine.

    A point during which other processes took more than `max_foreign` of the CPUs (from
    /proc/stat, less this process's own time) is measured again, up to `tries` times, each
    time after waiting (up to `max_wait_s`, and `wait_budget_s` over the whole run) for
    their share to fall; the quietest attempt is kept.

    The machine's own noise is not gated: on a shared VM a 1-row decode step moves by a good
    part of itself from one second to the next with nothing else running (and runs slower
    for a while after the CPUs idled), so a canary gate that tight would mostly discard
    noise that every real run has too, and its own pauses would make the next canary slower.
    A canary and a prefill probe are timed three times at the start and the end (`canary`),
    to say how far the machine drifted over the calibration, and once after every grid point
    (`between_points`), whose medians are the state the fit describes.
    """

    def __init__(
        self,
        serve: Callable[[Point], PointRun],
        max_foreign: float,
        max_wait_s: float,
        wait_budget_s: float = 120.0,
        tries: int = 3,
        enabled: bool = True,
    ) -> None:
        self.serve = serve
        self.max_foreign, self.max_wait_s, self.wait_budget_s = (
            max_foreign,
            max_wait_s,
            wait_budget_s,
        )
        self.tries = tries if enabled else 1
        self.enabled = enabled
        self.waited_s = 0.0
        self.retries = 0
        self.best_canary = float("inf")  # the quietest canary run's median step
        self.best_prefill = float("inf")  # the quietest prefill probe's step
        # One pair of probes after each grid point: the machine's typical state while the
        # grid was measured, as a median, the statistic sim_check takes around real runs.
        self.grid_canaries: list[float] = []
        self.grid_prefills: list[float] = []
        self.last: tuple[float, float] | None = None  # the latest pair of probes

    def probes(self) -> tuple[float, float]:
        """One canary run's median decode step and one prefill probe's step, seconds."""
        got = self.serve(CANARY)
        decode = statistics.median(s[1] for s in got.steps if s[0].prefill_rows == 0)
        prefill = sum(s[1] for s in self.serve(PREFILL_CANARY).steps)
        self.best_canary = min(self.best_canary, decode)
        self.best_prefill = min(self.best_prefill, prefill)
        self.last = (decode, prefill)
        return decode, prefill

    def canary(self, n: int = 3) -> float:
        """The median over `n` canary runs, back to back, of each run's median decode step;
        each followed by the prefill probe. The quietest of each is kept."""
        return statistics.median(self.probes()[0] for _ in range(n))

    def between_points(self) -> None:
        """The probes once more, between two grid points: the grid's own state."""
        decode, prefill = self.probes()
        self.grid_canaries.append(decode)
        self.grid_prefills.append(prefill)

    def busy(self, m: PointRun) -> bool:
        return m.foreign > self.max_foreign

    @property
    def spent(self) -> bool:
        """The whole run's waiting budget is used up: measure on, as the machine is."""
        return self.waited_s >= self.wait_budget_s

    def wait(self) -> None:
        """Until the others' share is back in bounds (or the time allowed is up)."""
        t = time.perf_counter()
        limit = min(self.max_wait_s, self.wait_budget_s - self.waited_s)
        while time.perf_counter() - t < limit and others_share(1.0) > self.max_foreign:
            pass
        self.waited_s += time.perf_counter() - t

    def measure(self, point: Point) -> PointRun:
        """The point's quietest run, with the probes around it (`PointRun.probes`): the
        pair before it and the pair `between_points` times after it."""
        before = self.last
        best: PointRun | None = None
        for attempt in range(1, self.tries + 1):
            got = self.serve(point)
            got.attempts = attempt
            if best is None or got.foreign < best.foreign:
                best = got
            if not self.enabled or not self.busy(got) or self.spent:
                break
            self.retries += 1
            self.wait()
        assert best is not None
        self.between_points()
        assert self.last is not None
        if before is not None:
            best.probes = (
                (before[0] + self.last[0]) / 2,
                (before[1] + self.last[1]) / 2,
            )
        return best
