"""The engine's one clock: every timestamp (arrival, admission, each token, finish) and every
wait for an arrival goes through it.

- `WallClock`: real time since the run started; waiting for an arrival sleeps.
- `VirtualClock`: simulated time. Waiting jumps to the arrival. Each step advances it by the
  executor's predicted seconds plus the engine's host time, which is an explicit choice:
  `measured` lets the engine's own host work flow into it as it happens on this machine;
  `model` adds a per-step and per-row cost instead (deterministic: two runs give identical
  metrics, and right for a machine that is not this one). The executor's own work (for a
  simulator, its prediction) never enters the virtual clock: it is frozen during the call.

  On a CPU the forward runs on the host's own cores, so host and executor take turns. A GPU
  runs its queue while the host goes on (`overlap`): a step's device seconds then run from
  its launch, and the host waits for them only where the real engine does, at its next
  blocking host-to-device copies (the executor's input tensors) and when it drains held
  tokens. Under immediate output every step drains at once, so both ways give the same
  times; deferred output lets the engine's host work hide behind the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from framework.core.step_stats import HOST_PHASES


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

    def executed(self, host_s: float, device_s: float) -> tuple[float, float]:
        """The executor returned: it spent `host_s` preparing the step's inputs and the
        device `device_s` on the forward and sampling. Returns when the step's tokens exist
        on the device and how long the host waited for the device before preparing (both 0
        on a clock that only reads the time)."""

    def fetched(self, ready_at: float, readback_s: float) -> tuple[float, float]:
        """Held tokens whose device work ends at `ready_at` are brought home by a copy that
        an executor predicts rather than does (`readback_s`). Returns the seconds the host
        waited for the device, and for the copy."""

    def account(self, phase_s: dict[str, float], rows: int) -> None:
        """A step's seconds by phase, as this clock counted them (`StepStats.phase_s`)."""

    def pause(self) -> None:
        """Time stops counting for this clock (a cluster's replica while the others step)."""

    def resume(self) -> None:
        """Time counts again from now."""


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

    def executed(self, host_s: float, device_s: float) -> tuple[float, float]:
        """Already elapsed."""
        return 0.0, 0.0

    def fetched(self, ready_at: float, readback_s: float) -> tuple[float, float]:
        """Real time has passed by itself."""
        return 0.0, 0.0

    def account(self, phase_s: dict[str, float], rows: int) -> None:
        """Measured as they happened."""

    def pause(self) -> None:
        """Real time passes whatever is asked."""

    def resume(self) -> None:
        """Real time passes whatever is asked."""


class VirtualClock:
    """Simulated seconds. With `host_s` (the `model` host time) the clock moves only by what
    it is told; without it (`measured`), the real time the engine spends between executor
    calls flows into it too. The clock is the host's; with `overlap` the device keeps its
    own timeline (`device_free`: when the work queued so far ends)."""

    name = "virtual"

    def __init__(
        self,
        host_s: Callable[[int], float] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        overlap: bool = False,
    ) -> None:
        self.host_s = host_s
        self.timer = timer
        self.overlap = overlap
        self._t = 0.0
        self._mark = timer()
        self.device_free = 0.0
        self._paused = False

    def start(self) -> None:
        self._t = 0.0
        self._mark = self.timer()
        self.device_free = 0.0
        self._paused = False

    def now(self) -> float:
        if self.host_s is not None or self._paused:
            return self._t
        return self._t + (self.timer() - self._mark)

    def pause(self) -> None:
        """Under `measured` host time, the real time that passes from here on is another
        replica's work, not this one's: it stops flowing in until `resume`."""
        if not self._paused:
            self._t = self.now()
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._mark = self.timer()
            self._paused = False

    def wait_until(self, t: float) -> None:
        if t > self.now():
            self._t = t
            self._mark = self.timer()

    def executing(self, rows: int) -> None:
        if self.host_s is not None:
            self._t += self.host_s(rows)
        else:  # freeze: fold the host time so far in, and stop it flowing
            self._t = self.now()

    def executed(self, host_s: float, device_s: float) -> tuple[float, float]:
        host_s, device_s = max(0.0, host_s), max(0.0, device_s)
        waited = 0.0
        if self.overlap:
            # The inputs' blocking copies wait for the device's queue; the launch returns
            # at once and the device runs the step from there.
            waited = max(0.0, self.device_free - self._t)
            self._t += waited + host_s
            self.device_free = self._t + device_s
            ready = self.device_free
        else:
            self._t += host_s + device_s
            ready = self._t
        self._mark = self.timer()
        return ready, waited

    def fetched(self, ready_at: float, readback_s: float) -> tuple[float, float]:
        """Added to the host's time as it is (the host time flowing in under `measured`
        keeps flowing). With `overlap` each step's copy starts on a second stream as its
        sampling ends, so the host waits until the newest drained step's copy is done."""
        readback_s = max(0.0, readback_s)
        if not self.overlap:
            self._t += readback_s
            return 0.0, readback_s
        now = self.now()
        waited = max(0.0, ready_at - now)
        copy = max(0.0, ready_at + readback_s - max(now, ready_at))
        self._t += waited + copy
        return waited, copy

    def account(self, phase_s: dict[str, float], rows: int) -> None:
        """Modelled host time replaces the measured phases: what the clock advanced by is
        what the step reports, so a step's phases add up to its time on this clock."""
        if self.host_s is None:
            return
        for name in HOST_PHASES:
            phase_s[name] = 0.0
        phase_s["host"] = self.host_s(rows)
