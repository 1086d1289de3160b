"""The engine's one clock: every timestamp (arrival, admission, each token, finish) and every
wait for an arrival goes through it.

- `WallClock`: real time since the run started; waiting for an arrival sleeps.
- `VirtualClock`: simulated time. Waiting jumps to the arrival. Each step advances it by the
  executor's predicted seconds plus the engine's host time, which is an explicit choice:
  `measured` lets the engine's own host work flow into it as it happens on this machine;
  `model` adds a per-step and per-row cost instead (deterministic: two runs give identical
  metrics, and right for a machine that is not this one). The executor's own work (for a
  simulator, its prediction) never enters the virtual clock: it is frozen during the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from framework.engine.counters import HOST_PHASES


class Clock(Protocol):
    name: str  # "wall" or "virtual": metrics.json says which clock a run's times are on

    def start(self) -> None:
        """The run starts now: `now()` reads 0."""

    def now(self) -> float:
        """Seconds since the run started."""

    def wait_until(self, t: float) -> None:
        """Nothing to do before `t` (an arrival): get there."""

    def executing(self, rows: int) -> None:
        """The executor is called next, for a batch of `rows` rows."""

    def executed(self, seconds: float) -> None:
        """The executor returned; it says the call took `seconds`."""

    def spend(self, seconds: float) -> None:
        """Device time outside the executor's call that an executor predicts rather than
        spends (a simulated readback of sampled tokens)."""

    def account(self, phase_s: dict[str, float], rows: int) -> None:
        """A step's seconds by phase, as this clock counted them (`StepStats.phase_s`)."""


class WallClock:
    name = "wall"

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, t: float) -> None:
        wait = t - self.now()
        if wait > 0:
            time.sleep(wait)

    def executing(self, rows: int) -> None:
        """Real time passes by itself during the call."""

    def executed(self, seconds: float) -> None:
        """Already elapsed."""

    def spend(self, seconds: float) -> None:
        """Real time has passed by itself."""

    def account(self, phase_s: dict[str, float], rows: int) -> None:
        """Measured as they happened."""


class VirtualClock:
    """Simulated seconds. With `host_s` (the `model` host time) the clock moves only by what
    it is told; without it (`measured`), the real time the engine spends between executor
    calls flows into it too."""

    name = "virtual"

    def __init__(
        self,
        host_s: Callable[[int], float] | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.host_s = host_s
        self.timer = timer
        self._t = 0.0
        self._mark = timer()

    def start(self) -> None:
        self._t = 0.0
        self._mark = self.timer()

    def now(self) -> float:
        if self.host_s is not None:
            return self._t
        return self._t + (self.timer() - self._mark)

    def wait_until(self, t: float) -> None:
        if t > self.now():
            self._t = t
            self._mark = self.timer()

    def executing(self, rows: int) -> None:
        if self.host_s is not None:
            self._t += self.host_s(rows)
        else:  # freeze: fold the host time so far in, and stop it flowing
            self._t = self.now()

    def executed(self, seconds: float) -> None:
        self._t += max(0.0, seconds)
        self._mark = self.timer()

    def spend(self, seconds: float) -> None:
        """Added as it is (the host time flowing in under `measured` keeps flowing)."""
        self._t += max(0.0, seconds)

    def account(self, phase_s: dict[str, float], rows: int) -> None:
        """Modelled host time replaces the measured phases: what the clock advanced by is
        what the step reports, so a step's phases add up to its time on this clock."""
        if self.host_s is None:
            return
        for name in HOST_PHASES:
            phase_s[name] = 0.0
        phase_s["host"] = self.host_s(rows)
