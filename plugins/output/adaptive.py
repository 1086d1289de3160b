"""Adaptive output: picks the window k at run time from what it measures.

Per step, a window k saves about `transfer_s * (1 - 1/k)` (fewer journeys; the saving
saturates) and costs about `f * (k + 1) / 2 * row_s`: overshoot rows, where f is the expected
number of requests finishing on a stop token per step. f comes from the running requests that
can stop (not `ignore_eos`): each contributes 1 / its remaining budget. The best k is small
and depends on the workload; where generations are short, or a transfer is cheap next to a
row (a CPU), it is 0: no deferral.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import OutputPolicy, OutputView, PolicyConfig, hookimpl
from plugins.output.deferred import keep_within


@dataclass
class AdaptiveConfig(PolicyConfig):
    max_window: int = 16
    # Until both costs are measured, no deferral: guessing would bias the first decisions.


def best_window(transfer_s: float, row_s: float, finish_rate: float, max_window: int) -> int:
    """argmin over k in 0..max_window of cost(k) - saving(k); 0 when nothing pays."""
    best, best_net = 0, 0.0
    for k in range(1, max_window + 1):
        net = finish_rate * (k + 1) / 2 * row_s - transfer_s * (1 - 1 / k)
        if net < best_net:
            best, best_net = k, net
    return best


def finish_rate(view: OutputView) -> float:
    rate = 0.0
    for s in view.running:
        if s.finished or (s.sampling.ignore_eos and not s.sampling.stop_token_ids):
            continue
        remaining = s.sampling.max_tokens - len(s.output_token_ids) - s.num_held
        rate += 1.0 / max(remaining, 1)
    return rate


class AdaptiveOutput(OutputPolicy):
    """Chooses the readback window each step from the measured costs of a row and a transfer."""

    def __init__(self, cfg: AdaptiveConfig) -> None:
        super().__init__(cfg)
        if cfg.max_window < 0:
            raise ValueError(f"output.max_window must be >= 0; got {cfg.max_window}")
        self.max_window = cfg.max_window
        self.k = 0

    def keep(self, view: OutputView) -> int:
        if view.transfer_s is None or view.row_s is None:
            self.k = 0
        else:
            self.k = best_window(view.transfer_s, view.row_s, finish_rate(view), self.max_window)
        return keep_within(view.held_steps, self.k)

    def window(self) -> float:
        return float(self.k)


@hookimpl
def register_outputs(register) -> None:  # type: ignore[no-untyped-def]
    register("adaptive", AdaptiveOutput, AdaptiveConfig)
