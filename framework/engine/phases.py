"""A step's seconds by phase, the way `StepStats.phase_s` reports them.

The engine's host phases are laps of one timer: `lap(name)` charges the time since the last
lap to `name`, so a phase done in two parts (scheduling before and after growth) adds up by
itself. Seconds that another party measures or predicts (the executor's forward and
sampling, a simulator's readbacks and its host waiting for the device) are added as numbers.
"""

from __future__ import annotations

from time import perf_counter


class PhaseTimer:
    __slots__ = ("_last", "phases", "readback", "wait")

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        """A new step: no phase yet."""
        self.phases: dict[str, float] = {}
        self.readback = 0.0  # predicted readbacks of sampled tokens (a simulator's)
        self.wait = 0.0  # the host waiting for a simulated device (`executor.overlap`)
        self._last = perf_counter()

    def lap(self, name: str) -> None:
        """The host time since the last lap was spent on `name`."""
        now = perf_counter()
        phases = self.phases
        phases[name] = phases.get(name, 0.0) + (now - self._last)
        self._last = now

    def skip(self) -> None:
        """The time since the last lap was no host phase's (the executor's call)."""
        self._last = perf_counter()

    def add(self, name: str, seconds: float) -> None:
        """Seconds measured or predicted elsewhere, charged to `name`."""
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def close(self) -> dict[str, float]:
        """The step's phases, with the predicted readbacks and waits where there were any."""
        if self.readback:
            self.phases["readback"] = self.readback
        if self.wait:
            self.phases["wait"] = self.wait
        return self.phases
