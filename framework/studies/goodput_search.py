"""The capacity search: the highest request rate at which a config meets an SLO, found by
bracketing, then bisecting over rates, whatever runs each probe (`goodput_probes.Prober`: one
simulated run; any callable from a rate to a run's metrics).

The SLO is a list of conditions (`slo.Condition`), every one of which a probe must meet:
conditions on the run's metrics (Sarathi-Serve's capacity: `scheduling_delay_p50_s <= 2` and
`tbt_p99_s <= 0.1`), DistServe's attainment (`slo.attainment_condition(0.9)` on a prober that
measures it), or both. The rate found is DistServe's goodput and Sarathi-Serve's capacity
alike; a reproduction calls it directly:

    from framework.studies.goodput_search import find_capacity
    from framework.studies.slo import parse_condition

    found = find_capacity(
        lambda rate: run_at(rate),  # the run's metrics.json, as a dict
        [parse_condition("scheduling_delay_p50<=2"), parse_condition("tbt_p99<=0.1")],
        low=1.0,
    )
    found.goodput, found.status, [(p.rate, p.passed) for p in found.probes]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from framework.studies.slo import Check, Condition, check


@dataclass(frozen=True)
class Probe:
    """One rate probed: the run's metrics, and each condition judged on them."""

    rate: float
    metrics: Mapping[str, Any]
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """Whether every condition held: the probe met the SLO."""
        return all(c.passed for c in self.checks)


@dataclass
class CapacityResult:
    """What a search found. `goodput` is the highest rate probed that met every condition
    (None when none did); `low` and `high` bracket it: `low` met (None: no probe did), `high`
    did not (None: every probe met). `status` says why the search stopped: `converged`
    ((high - low) / low <= tolerance), `budget` (out of probes while bisecting), `below`
    (even the lowest rate probed missed), `above` (even the highest met). `probes`: every
    probe, in the order made."""

    goodput: float | None
    low: float | None
    high: float | None
    status: str
    tolerance: float
    conditions: tuple[Condition, ...]
    probes: list[Probe] = field(default_factory=list)

    @property
    def width(self) -> float | None:
        """The bracket's relative width, (high - low) / low; None while it is open."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / self.low


def find_capacity(
    prober: Callable[[float], Mapping[str, Any]],
    conditions: Sequence[Condition],
    low: float,
    high: float | None = None,
    *,
    tolerance: float = 0.05,
    growth: float = 2.0,
    max_probes: int = 20,
    on_probe: Callable[[Probe], None] | None = None,
) -> CapacityResult:
    """The highest rate at which `prober(rate)` (the run's metrics) meets every condition.

    Bisection assumes a probe meets the SLO below some rate and misses it above. The search
    first makes sure `low` meets it (dividing it by `growth` while it does not) and `high`
    (`low` x `growth` unless given) does not (multiplying it while it does), then probes the
    geometric middle of the bracket until (high - low) / low <= `tolerance`. At most
    `max_probes` calls of `prober` in all, each rate probed at most once; `on_probe` sees
    each probe as it is judged. Where the SLO is not monotone in the rate the result is
    still a bracket of two probes, one that met and one that missed, within `tolerance` of
    each other.
    """
    if not conditions:
        raise ValueError("a capacity search needs at least one condition")
    high = low * growth if high is None else high
    if not 0 < low < high:
        raise ValueError(f"the search needs 0 < low < high; got low={low}, high={high}")
    if growth <= 1:
        raise ValueError(f"growth must be > 1; got {growth}")
    conds = tuple(conditions)
    seen: dict[float, Probe] = {}
    order: list[Probe] = []

    def met(rate: float) -> bool:
        if rate not in seen:
            metrics = prober(rate)
            seen[rate] = Probe(rate, metrics, check(conds, metrics))
            order.append(seen[rate])
            if on_probe is not None:
                on_probe(seen[rate])
        return seen[rate].passed

    def result(goodput: float | None, lo: float | None, hi: float | None, status: str):
        return CapacityResult(goodput, lo, hi, status, tolerance, conds, order)

    # Bracket: low must meet the SLO and high must miss it.
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
