"""The goodput search's probes: each one simulated run of the config at a given
`workload.rate`, through `run.py`'s own path, and the checks that a config can be searched
at all (a simulated executor, a workload whose rate is requests per second). `search` runs a
whole search over them.
"""

from __future__ import annotations

import contextlib
import io
import math
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
from framework.studies.goodput_search import GoodputResult, find_goodput
from framework.studies.goodput_search import attainment as share_met

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
COLUMNS = (
    "probe", "rate_rps", "attainment", "met", "ttft_met", "tpot_met", "requests",
    "requests_finished", "requests_rejected", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
    "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "throughput_rps", "served_ratio",
    "output_tokens_per_s", "makespan_s",
)  # fmt: skip
# What the simulated runs' metrics.json says produced their seconds.
PROFILE_KEYS = ("clock", "cost_model", "profile", "hardware", "tensor_parallel", "overlap")


# ---- the probes: one simulated run each ---------------------------------------------------
@dataclass
class Prober:
    """Runs the config at a given `workload.rate` through `run.py`'s own path (config checks,
    workload, `build_runner`, so a cluster works as it does there) over one loaded model
    shape, and keeps each run's row for the report."""

    overrides: list[str]
    slo: tuple[float, float]  # (ttft_s, tpot_s)
    target: float
    runs_dir: Path
    loaded: tuple[Any, ...] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)  # each probe's metrics.json
    profile: dict[str, Any] = field(default_factory=dict)
    say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)

    def config(self, rate: float) -> DictConfig:
        return compose_cfg([*self.overrides, f"workload.rate={rate!r}"])

    def __call__(self, rate: float) -> float:
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
        seqs = info.result.seqs
        share = share_met(seqs, *self.slo)
        ttft_s, tpot_s = self.slo
        makespan = s["makespan_s"]
        throughput = s["requests_finished"] / makespan if makespan else 0.0
        self.rows.append(
            {
                "probe": n,
                "rate_rps": rate,
                "attainment": share,
                "met": share >= self.target,
                "ttft_met": share_met(seqs, ttft_s, math.inf),  # each target alone
                "tpot_met": share_met(seqs, math.inf, tpot_s),
                **{k: s[k] for k in COLUMNS if k in s},
                "throughput_rps": throughput,
                "served_ratio": throughput / rate,
            }
        )
        self.summaries.append(s)
        self.profile = self.profile or {k: s[k] for k in PROFILE_KEYS if k in s}
        verdict = "met" if share >= self.target else "missed"
        self.say(f"probe {n}: {rate:.4g} req/s: attainment {share:.3f} ({verdict})")
        return share


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
    ttft_s: float,
    tpot_s: float,
    *,
    attainment: float = 0.9,
    low: float | None = None,
    high: float | None = None,
    tolerance: float = 0.05,
    growth: float = 2.0,
    max_probes: int = 20,
    runs_dir: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[GoodputResult, Prober, DictConfig]:
    """Check the config of `overrides` (after `BASE`) and search it: (the result, the prober
    with every probe's row and metrics, the config at its own rate). The first rate is `low`,
    else half of `high`, else the workload's own rate; `high` is twice `low` unless given.
    Each probe's run folder goes under `runs_dir` (kept), else to a temporary folder."""
    composed = [*BASE, *overrides]
    cfg = compose_cfg(composed)
    rate = check_config(cfg)
    low = low if low is not None else (high / 2 if high else rate)
    high = high if high is not None else 2 * low
    if low >= high:
        raise UserError(f"the upper rate ({high:g}) must be above the first rate ({low:g})")
    with tempfile.TemporaryDirectory() as tmp:
        prober = Prober(composed, (ttft_s, tpot_s), attainment, runs_dir or Path(tmp))
        if say is not None:
            prober.say = say
        result = find_goodput(
            prober, low, high, attainment, tolerance, growth=growth, max_probes=max_probes
        )
    return result, prober, cfg
