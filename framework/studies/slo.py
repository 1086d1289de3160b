"""What an SLO is to a capacity search (`goodput_search.find_capacity`): conditions a run at a
given rate must meet, of two kinds.

- **A condition on the run's metrics** (`Condition`): `tbt_p99_s <= 0.1` and
  `scheduling_delay_p50_s <= 2` (Sarathi-Serve's capacity), `ttft_p90_s <= 0.4` and
  `tpot_p90_s <= 0.04` (the DistServe blog's toy: each percentile on its own). Typed as
  `METRIC OP NUMBER`, OP one of `<=`, `<`, `>=`, `>`, METRIC a key of `metrics.json` (its
  `_s` may be left off) or one a probe adds (`PROBE_KEYS`); `parse_condition` reads one and
  refuses an unknown metric or a malformed condition in one line that lists what it takes.
- **DistServe's attainment**: a request meets the per-request targets when it finished with
  TTFT <= ttft_s and TPOT <= tpot_s (`slo_met`); the attainment is the share of ALL the
  workload's requests that did (`attainment`), and the condition on it is that share reaching
  a target (`attainment_condition`: `attainment >= 0.9`). The two forms differ: a percentile
  is over the finished requests and judges each latency on its own; attainment counts a
  rejected or unfinished request as a miss and asks both targets of the same request.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from framework.cluster.result import ClusterResult
from framework.core.sequence import Sequence as Request
from framework.engine.counters import Counters
from framework.run.errors import UserError
from framework.run.summary import summarize

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}
# What a probe adds to its run's metrics.json: requests finished per second of makespan, and
# that over the offered rate (`goodput_probes.Prober`).
PROBE_KEYS = ("throughput_rps", "served_ratio")
# A cluster's own metrics (`summary.cluster_summary`), absent from one engine's summary.
CLUSTER_KEYS = ("cluster_replicas", "load_imbalance")
ATTAINMENT = "attainment"  # the probe's key of DistServe's attainment (`attainment`)
_CONDITION = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*([^\s<=>]\S*)\s*")


def number(x: float) -> str:
    """A bound as typed back: its shortest form (`0.1`, `2`), exact."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


@dataclass(frozen=True)
class Condition:
    """`metric OP bound` on a probe's metrics, e.g. `tbt_p99_s <= 0.1`."""

    metric: str
    op: str
    bound: float

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"op must be one of {', '.join(OPERATORS)}; got {self.op!r}")

    @property
    def text(self) -> str:
        """The condition without spaces (`tbt_p99_s<=0.1`): its column in a report."""
        return f"{self.metric}{self.op}{number(self.bound)}"

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {number(self.bound)}"

    def holds(self, value: Any) -> bool:
        """Whether `value` meets it. A metric no request defined (None: no request finished,
        say; NaN) meets nothing: a run that served nobody is no evidence of capacity."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return False
        return bool(OPERATORS[self.op](float(value), self.bound))


@dataclass(frozen=True)
class Check:
    """One condition judged on one probe: the metric's value and whether it held."""

    condition: Condition
    value: float | None
    passed: bool


@functools.cache
def metric_names() -> tuple[str, ...]:
    """Every metric a condition may name: the numbers of a run's `metrics.json`, read off the
    summary of a run of no request with a disaggregated cluster's KV transfers (so a number
    the summary gains is a metric here at once), a cluster's own, and a probe's own."""
    empty = ClusterResult([], [], Counters(), 1, 0, 0, transfers=[], link={})
    keys = [
        k
        for k, v in summarize(empty).items()
        if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    ]
    return (*keys, *CLUSTER_KEYS, *PROBE_KEYS)


def parse_condition(
    text: str, flag: str = "--slo", names: Iterable[str] | None = None
) -> Condition:
    """`METRIC OP NUMBER` as typed (`tbt_p99<=0.1`, `scheduling_delay_p50_s <= 2`), its metric
    one of `names` (default `metric_names()`), with or without its `_s`. A malformed
    condition or an unknown metric is a `UserError` naming `flag` and what it takes."""
    shape = (
        f"{flag} takes METRIC OP NUMBER, OP one of {', '.join(OPERATORS)} (e.g. {flag} "
        "'tbt_p99<=0.1', quoted: a shell reads an unquoted < or > as a redirection)"
    )
    match = _CONDITION.fullmatch(text)
    if match is None:
        raise UserError(f"{flag} {text!r}: not a condition; {shape}")
    name, op, bound_text = match.groups()
    try:
        bound = float(bound_text)
    except ValueError:
        raise UserError(f"{flag} {text!r}: {bound_text!r} is not a number; {shape}") from None
    if not math.isfinite(bound):
        raise UserError(f"{flag} {text!r}: the bound must be a finite number; {shape}")
    known = tuple(names) if names is not None else metric_names()
    for metric in (name, f"{name}_s"):
        if metric in known:
            return Condition(metric, op, bound)
    raise UserError(
        f"{flag} {text!r}: no metric {name}; {shape}, METRIC one of (the _s may be left "
        f"off): {', '.join(known)}"
    )


def check(conditions: Sequence[Condition], metrics: Mapping[str, Any]) -> tuple[Check, ...]:
    """Each condition judged on a probe's `metrics`. A metric the run does not write at all
    is the user's mistake (a cluster's metric of one engine, say), refused in one line."""
    checks = []
    for c in conditions:
        if c.metric not in metrics:
            raise UserError(
                f"condition {c.text}: the run at this rate wrote no {c.metric} (a cluster's "
                "own metrics need cluster.replicas > 1, its KV transfers' prefill replicas "
                "(cluster.roles))"
            )
        value = metrics[c.metric]
        checks.append(Check(c, None if value is None else float(value), c.holds(value)))
    return tuple(checks)


# ---- DistServe's attainment ---------------------------------------------------------------
def slo_met(seqs: list[Request], ttft_s: float, tpot_s: float) -> np.ndarray:
    """Per request (in `seqs`' order), whether it met the per-request targets: it finished,
    its time to first token is <= `ttft_s`, and its time per output token after the first,
    (finish - first token) / (output tokens - 1), is <= `tpot_s`. With one output token TPOT
    is undefined, and TTFT alone decides. Rejected and unfinished requests miss (they have
    no finish time)."""
    nan = float("nan")
    arrival = np.array([s.arrival for s in seqs], dtype=float)
    first = np.array([nan if s.first_token_at is None else s.first_token_at for s in seqs])
    done = np.array([nan if s.finished_at is None else s.finished_at for s in seqs])
    tokens = np.array([len(s.output_token_ids) for s in seqs], dtype=float)
    served = ~np.isnan(first) & ~np.isnan(done) & (tokens >= 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (done - first) / (tokens - 1), 0.0)
    return served & (first - arrival <= ttft_s) & (tpot <= tpot_s)


def attainment(seqs: list[Request], ttft_s: float, tpot_s: float) -> float:
    """The share of all requests that met both targets (`slo_met`); 0 for no requests."""
    met = slo_met(seqs, ttft_s, tpot_s)
    return float(met.mean()) if met.size else 0.0


def attainment_condition(target: float) -> Condition:
    """DistServe's pass rule: at least `target` of all requests met both targets."""
    return Condition(ATTAINMENT, ">=", target)
