"""Deferred-k output: sampled tokens stay on the device for up to k steps, then come home in
one concatenation and one transfer. The next step's inputs are taken from the held tensor,
so while the rows do not change nothing crosses to the host between forwards.

What k buys: k-1 fewer journeys per k steps. What it costs: a request whose stop token is
held keeps its row for (k+1)/2 more steps on average (overshoot). `window=0` is immediate.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import II

from framework.api import OutputPolicy, OutputView, PolicyConfig, hookimpl


def keep_within(held_steps: int, k: int) -> int:
    """Steps that may stay held under window k. Over the window the older steps come home
    and the newest stays, so its readback never waits on a forward that may still run."""
    if held_steps <= k:
        return held_steps
    return 1 if k >= 1 else 0


@dataclass
class DeferredConfig(PolicyConfig):
    window: int = II("window")  # the top-level `window=` override


class DeferredOutput(OutputPolicy):
    """Keeps sampled tokens on the device up to `window` steps; one transfer brings them home."""

    def __init__(self, cfg: DeferredConfig) -> None:
        super().__init__(cfg)
        if int(cfg.window) < 0:
            raise ValueError(f"window (output.window) must be >= 0; got {cfg.window}")
        self.k = int(cfg.window)

    def keep(self, view: OutputView) -> int:
        return keep_within(view.held_steps, self.k)

    def window(self) -> float:
        return float(self.k)


@hookimpl
def register_outputs(register) -> None:  # type: ignore[no-untyped-def]
    register("deferred", DeferredOutput, DeferredConfig)
