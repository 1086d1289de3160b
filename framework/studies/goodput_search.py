"""Goodput under an SLO, as DistServe defines it, the search itself: which requests of a run
met a TTFT and a TPOT target (`slo_met`, `attainment`), and the bracketing bisection over
request rates that finds the highest rate whose attainment reaches a target
(`find_goodput`), whatever runs each probe (`goodput_probes.Prober`: a simulated run).

A request meets the SLO when it finished with TTFT <= ttft_s and TPOT <= tpot_s, TPOT being
(finish - first token) / (output tokens - 1); a request of one output token has no TPOT and is
judged on its TTFT alone. Attainment is the share of ALL the workload's requests that met it:
a rejected or unfinished request is a miss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from framework.engine.sequence import Sequence


# ---- the SLO ------------------------------------------------------------------------------
def slo_met(seqs: list[Sequence], ttft_s: float, tpot_s: float) -> np.ndarray:
    """Per request (in `seqs`' order), whether it met the SLO: it finished, its time to
    first token is <= `ttft_s`, and its time per output token after the first is <= `tpot_s`.
    With one output token TPOT is undefined, and TTFT alone decides. Rejected and unfinished
    requests miss (they have no finish time)."""
    nan = float("nan")
    arrival = np.array([s.arrival for s in seqs], dtype=float)
    first = np.array([nan if s.first_token_at is None else s.first_token_at for s in seqs])
    done = np.array([nan if s.finished_at is None else s.finished_at for s in seqs])
    tokens = np.array([len(s.output_token_ids) for s in seqs], dtype=float)
    served = ~np.isnan(first) & ~np.isnan(done) & (tokens >= 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (done - first) / (tokens - 1), 0.0)
    return served & (first - arrival <= ttft_s) & (tpot <= tpot_s)


def attainment(seqs: list[Sequence], ttft_s: float, tpot_s: float) -> float:
    """The share of all requests that met both targets (`slo_met`); 0 for no requests."""
    met = slo_met(seqs, ttft_s, tpot_s)
    return float(met.mean()) if met.size else 0.0


# ---- the search ---------------------------------------------------------------------------
@dataclass
class GoodputResult:
    """What a search found. `goodput` is the highest rate probed whose attainment reached
    the target (None when none did); `low` and `high` bracket it: `low` met (None: no probe
    did), `high` did not (None: every probe met). `status` says why the search stopped:
    `converged` ((high - low) / low <= tolerance), `budget` (out of probes while bisecting),
    `below` (even the lowest rate probed missed), `above` (even the highest met)."""

    goodput: float | None
    low: float | None
    high: float | None
    status: str
    target: float
    tolerance: float
    probes: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment)

    @property
    def width(self) -> float | None:
        """The bracket's relative width, (high - low) / low; None while it is open."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / self.low


def find_goodput(
    probe: Callable[[float], float],
    low: float,
    high: float,
    target: float,
    tolerance: float,
    *,
    growth: float = 2.0,
    max_probes: int = 20,
) -> GoodputResult:
    """The highest rate at which `probe(rate)` (an attainment in [0, 1]) reaches `target`.

    Bisection assumes attainment falls as the rate rises, crossing the target once. It
    first makes sure `low` meets the target (dividing it by `growth` while it does not)
    and `high` does not (multiplying it while it does), then probes the geometric middle
    of the bracket until (high - low) / low <= `tolerance`. At most `max_probes` calls of
    `probe` in all, each rate probed at most once. Where attainment is not monotone the
    result is still a bracket of two probes, one that met and one that missed, within
    `tolerance` of each other; every probe is in `probes`, in the order made.
    """
    if not 0 < low < high:
        raise ValueError(f"the search needs 0 < low < high; got low={low}, high={high}")
    if growth <= 1:
        raise ValueError(f"growth must be > 1; got {growth}")
    seen: dict[float, float] = {}
    order: list[tuple[float, float]] = []

    def met(rate: float) -> bool:
        if rate not in seen:
            seen[rate] = float(probe(rate))
            order.append((rate, seen[rate]))
        return seen[rate] >= target

    def result(goodput: float | None, lo: float | None, hi: float | None, status: str):
        return GoodputResult(goodput, lo, hi, status, target, tolerance, order)

    # Bracket: low must meet the target and high must miss it.
    if not met(low):
        while True:
            high, low = low, low / growth
            if len(order) >= max_probes:
                return result(None, None, high, "below")
            if met(low):
                break
    else:
        while True:
            if len(order) >= max_probes:
                return result(low, low, None, "above")
            if not met(high):
                break
            low, high = high, high * growth
    # Bisect in the bracket's geometric middle: the tolerance is relative to the rate.
    while (high - low) / low > tolerance:
        if len(order) >= max_probes:
            return result(low, low, high, "budget")
        mid = math.sqrt(low * high)
        if met(mid):
            low = mid
        else:
            high = mid
    return result(low, low, high, "converged")
