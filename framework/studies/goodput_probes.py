"""The capacity search's probes: each one simulated run of the config at a given
`workload.rate`, through `run.py`'s own path, and the checks that a config can be searched
at all (a simulated executor, a workload whose rate is requests per second). `search` runs a
whole search over them.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from framework.run.app import load
from framework.run.compose import compose_cfg
from framework.run.errors import UserError, user_input
from framework.run.observers import run_with_observers
from framework.studies.goodput_search import CapacityResult, Probe, find_capacity
from framework.studies.slo import ATTAINMENT, Check, Condition, attainment_condition, number
from framework.studies.slo import attainment as share_met

# Set before the user's overrides, which may change them: the profile's own per-step host
# cost (a probe then repeats exactly, whatever this machine is doing), no observers (a probe
# is no MLflow run of its own), and the console quiet.
BASE = ["executor.host_time=model", "observers=[]", "print_outputs=false"]
# Workload kinds whose `rate` is requests per second, and how to tell when it is in use.
RATE_KINDS = {
    "synthetic": "arrival=poisson or gamma",
    "shared_prefix": "rate set",
    "trace": "arrival=poisson or gamma",
}
# A probe's row in the report's table, after the columns of its conditions (the JSON report
# keeps every number of the run's metrics.json besides).
COLUMNS = (
    "probe", "rate_rps", "attainment", "met", "ttft_met", "tpot_met", "requests",
    "requests_finished", "requests_rejected", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
    "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "tbt_p50_s", "tbt_p99_s",
    "scheduling_delay_p50_s", "scheduling_delay_p99_s", "normalized_latency_s",
    "throughput_rps", "served_ratio", "output_tokens_per_s", "makespan_s",
)  # fmt: skip
# The columns of DistServe's per-request targets, which only a search with them has.
TARGET_COLUMNS = ("attainment", "ttft_met", "tpot_met")
# What the simulated runs' metrics.json says produced their seconds.
PROFILE_KEYS = ("clock", "cost_model", "profile", "hardware", "tensor_parallel", "overlap")


# ---- the probes: one simulated run each ---------------------------------------------------
@dataclass
class Prober:
    """Runs the config at a given `workload.rate` through `run.py`'s own path (config checks,
    workload, `build_runner`, so a cluster works as it does there) over one loaded model
    shape, and returns the run's metrics: every number of its metrics.json, what a probe adds
    (`slo.PROBE_KEYS`) and, given DistServe's per-request `targets` (ttft_s, tpot_s), the
    attainment and the share that met each target alone (`ttft_met`, `tpot_met`). Keeps
    each probe's row for the report; `record` adds the search's verdict to it."""

    overrides: list[str]
    runs_dir: Path
    targets: tuple[float, float] | None = None  # (ttft_s, tpot_s)
    loaded: tuple[Any, ...] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)  # each probe's metrics.json
    profile: dict[str, Any] = field(default_factory=dict)
    say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)

    def config(self, rate: float) -> DictConfig:
        return compose_cfg([*self.overrides, f"workload.rate={rate!r}"])

    def __call__(self, rate: float) -> dict[str, Any]:
        cfg = self.config(rate)
        if self.loaded is None:
            with user_input():
                self.loaded = load(cfg)
        n = len(self.rows) + 1
        # What a run says of itself (which profile prices it) is the same at every rate:
        # said by the first probe, not repeated by every other.
        quiet = contextlib.redirect_stderr(io.StringIO()) if n > 1 else contextlib.nullcontext()
        with quiet:
            info = run_with_observers(cfg, self.runs_dir / f"{n:02d}_rate_{rate:.6g}", self.loaded)
        assert info.result is not None  # serve returns only a finished run
        s = info.summary
        makespan = s["makespan_s"]
        throughput = s["requests_finished"] / makespan if makespan else 0.0
        row: dict[str, Any] = {"probe": n, "rate_rps": rate}
        row |= {k: v for k, v in s.items() if v is None or _is_number(v)}
        row |= {"throughput_rps": throughput, "served_ratio": throughput / rate}
        if self.targets is not None:
            seqs = info.result.seqs
            ttft_s, tpot_s = self.targets
            row[ATTAINMENT] = share_met(seqs, ttft_s, tpot_s)
            row["ttft_met"] = share_met(seqs, ttft_s, float("inf"))  # each target alone
            row["tpot_met"] = share_met(seqs, float("inf"), tpot_s)
        self.rows.append(row)
        self.summaries.append(s)
        self.profile = self.profile or {k: s[k] for k in PROFILE_KEYS if k in s}
        return dict(row)

    def record(self, probe: Probe) -> None:
        """The search's verdict on a probe into its row (`met`, and each condition's as a
        column named by it), and a line saying it."""
        row = next(r for r in self.rows if r["rate_rps"] == probe.rate)
        row["met"] = probe.passed
        row |= {c.condition.text: c.passed for c in probe.checks}
        verdict = "met" if probe.passed else "missed"
        said = ", ".join(map(_said, probe.checks))
        self.say(f"probe {row['probe']}: {probe.rate:.4g} req/s: {verdict}: {said}")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _said(c: Check) -> str:
    """A condition's verdict as a line says it: `tbt_p99_s 0.0934 (<= 0.1)`, `... (not <= 2)`."""
    cond = c.condition
    value = "undefined" if c.value is None else f"{c.value:.4g}"
    relation = f"{cond.op} {number(cond.bound)}"
    return f"{cond.metric} {value} ({relation if c.passed else 'not ' + relation})"


def check_config(cfg: DictConfig) -> float:
    """Refuse a config the search cannot use; return the workload's own rate (the default
    start of the search). The executor must be simulated, and the workload's `rate` must
    be requests per second and in use."""
    if cfg.executor.name != "simulated":
        raise UserError(
            f"executor={cfg.executor.name}: goodput searches on the simulated executor only "
            "(its virtual clock makes each probe seconds of work and repeatable); add "
            "executor=simulated"
        )
    w = cfg.workload
    kind = w.kind
    kinds = ", ".join(f"{k} ({how})" for k, how in RATE_KINDS.items())
    if kind == "multiturn":
        raise UserError(
            "workload=multiturn: its workload.rate counts conversations per second, not "
            "requests, so a goodput in requests/s cannot be searched on it; use "
            f"{', '.join(RATE_KINDS)}"
        )
    if kind not in RATE_KINDS:
        raise UserError(
            f"workload={kind}: no request rate to search (workload.rate, requests/s); "
            f"use a workload that takes one: {kinds}, e.g. workload=azure_conv_poisson"
        )
    arrival = w.get("arrival")
    if arrival in ("burst", "recorded"):
        raise UserError(
            f"workload.arrival={arrival}: the rate is not used under it; set "
            "workload.arrival=poisson (or gamma) for the search to vary workload.rate"
        )
    rate = w.get("rate")
    if rate is None:
        return 1.0  # (shared_prefix's null: the search sets one at each probe)
    return float(rate)


def search(
    overrides: Sequence[str],
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    *,
    attainment: float = 0.9,
    conditions: Sequence[Condition] = (),
    low: float | None = None,
    high: float | None = None,
    tolerance: float = 0.05,
    growth: float = 2.0,
    max_probes: int = 20,
    runs_dir: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[CapacityResult, Prober, DictConfig]:
    """Check the config of `overrides` (after `BASE`) and search it for the highest rate
    that meets every condition: DistServe's attainment (at least `attainment` of all requests
    within `ttft_s` and `tpot_s`, when the targets are given) and each of `conditions` on the
    run's metrics. Returns (the result, the prober with every probe's row and metrics, the
    config at its own rate). The first rate is `low`, else half of `high`, else the
    workload's own rate; `high` is twice `low` unless given. Each probe's run folder goes
    under `runs_dir` (kept), else to a temporary folder."""
    if (ttft_s is None) != (tpot_s is None):
        raise UserError(
            "--ttft and --tpot are DistServe's per-request targets and go together; for one "
            "latency alone give a condition on its percentile, e.g. --slo 'ttft_p90<=0.4'"
        )
    targets = None if ttft_s is None or tpot_s is None else (ttft_s, tpot_s)
    conds = [attainment_condition(attainment)] * (targets is not None) + list(conditions)
    if not conds:
        raise UserError(
            "no SLO to search under: give --slo METRIC<=X (a condition on the run's metrics, "
            "repeatable) or --ttft S --tpot S (DistServe's per-request targets), or both"
        )
    composed = [*BASE, *overrides]
    cfg = compose_cfg(composed)
    rate = check_config(cfg)
    low = low if low is not None else (high / 2 if high else rate)
    high = high if high is not None else 2 * low
    if low >= high:
        raise UserError(f"the upper rate ({high:g}) must be above the first rate ({low:g})")
    with tempfile.TemporaryDirectory() as tmp:
        prober = Prober(composed, runs_dir or Path(tmp), targets)
        if say is not None:
            prober.say = say
        result = find_capacity(
            prober,
            conds,
            low,
            high,
            tolerance=tolerance,
            growth=growth,
            max_probes=max_probes,
            on_probe=prober.record,
        )
    return result, prober, cfg
