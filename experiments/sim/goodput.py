"""Goodput under an SLO, as DistServe defines it: the highest request rate at which at least
`--attainment` (0.9) of the requests meet both a TTFT and a TPOT target. Found by bisection
on `workload.rate`, each probe one simulated run of the given config.

    python -m experiments.goodput --ttft 0.005 --tpot 0.001 executor=simulated model=tiny \\
        workload=synthetic workload.num_requests=200
    python -m experiments.goodput --ttft 0.5 --tpot 0.05 executor=simulated model=hf \\
        model.path=framework/executors/simulated/models/llama-8b dtype=bfloat16 \\
        executor.profile=llama-8b-bfloat16-h100-sxm.analytic workload=arxiv_poisson \\
        workload.limit=400 cluster.replicas=4 router=least_tokens \\
        engine.kv_memory_mb=61440 engine.max_num_seqs=128

A request meets the SLO when it finished with TTFT <= --ttft and TPOT <= --tpot, TPOT being
(finish - first token) / (output tokens - 1); a request of one output token has no TPOT and is
judged on its TTFT alone. Attainment is the share of ALL the workload's requests that met it:
a rejected or unfinished request is a miss. The search first brackets the goodput (`--high`
grows by `--growth` while it still meets the target, `--low` shrinks while it does not), then
bisects (geometric midpoints) until (high - low) / low <= `--tolerance`, within `--max-probes`
runs in all. The goodput is the highest rate probed that met the target, and every probe is
reported. Overrides are Hydra overrides of `run.py`; the config must be `executor=simulated`
(the probes then cost seconds and repeat exactly) and its workload must take a rate in
requests/s (`synthetic`, `shared_prefix`, or `trace` under a generated arrival process such as
`workload=azure_conv_poisson` or `arxiv_poisson`). Under `executor.host_time=model`, which
this tool sets unless overridden, every figure is in simulated seconds of the profile the runs
name (`cost_model`, `profile`, `hardware`), never this machine's. Writes `goodput.md`,
`goodput.csv` and `goodput.json` into `--out`; `--json` prints the JSON instead of the table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.toolkit import cli
from experiments.toolkit.config import compose_cfg
from experiments.toolkit.paths import OUTPUTS
from framework.engine.sequence import Sequence
from framework.run.app import load
from framework.run.cli import hydra_user_error
from framework.run.errors import UserError, user_input
from framework.run.observers import run_with_observers
from framework.tracking.tables import cell, markdown_table, write_csv
from framework.tracking.tags import environment_tags

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
# Below this share of the offered rate served (finished requests / makespan over the rate),
# the run at the goodput may not have kept up: requests that piled up and were served after
# the arrivals ended make its attainment that of a burst of so many requests, not of a load
# the config sustains. A sustained run falls short of 1 by its drain alone (the last
# requests' latency against the arrivals' span), which long outputs lengthen too: a hint to
# check, not a verdict.
SUSTAINED = 0.8
# What the simulated runs' metrics.json says produced their seconds.
PROFILE_KEYS = ("clock", "cost_model", "profile", "hardware", "tensor_parallel", "overlap")


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
        return compose_config([*self.overrides, f"workload.rate={rate!r}"])

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
        share = attainment(seqs, *self.slo)
        ttft_s, tpot_s = self.slo
        makespan = s["makespan_s"]
        throughput = s["requests_finished"] / makespan if makespan else 0.0
        self.rows.append(
            {
                "probe": n,
                "rate_rps": rate,
                "attainment": share,
                "met": share >= self.target,
                "ttft_met": attainment(seqs, ttft_s, math.inf),  # each target alone
                "tpot_met": attainment(seqs, math.inf, tpot_s),
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


# ---- the config ---------------------------------------------------------------------------
def compose_config(overrides: list[str]) -> DictConfig:
    """The run config of `overrides`; what Hydra refuses is the user's, as one line."""
    try:
        return compose_cfg(overrides)
    except Exception as error:
        message = hydra_user_error(error)
        if message is None:
            raise
        raise UserError(message) from error


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


# ---- the command line ---------------------------------------------------------------------
def positive(name: str) -> Callable[[str], float]:
    """An argument type: a number > 0, named in the message when it is not."""

    def read(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {text!r}") from None
        if not value > 0 or math.isinf(value):
            raise argparse.ArgumentTypeError(f"{name} must be > 0; got {text}")
        return value

    return read


def refuse(message: str) -> NoReturn:
    """argparse's errors as one line (its own print a usage block first)."""
    raise UserError(f"{message}; python -m experiments.goodput --help lists the arguments")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__)
    ap.error = refuse  # type: ignore[method-assign]
    ap.add_argument("--ttft", type=positive("--ttft"), required=True, help="TTFT target, s")
    ap.add_argument("--tpot", type=positive("--tpot"), required=True, help="TPOT target, s")
    ap.add_argument(
        "--attainment", type=positive("--attainment"), default=0.9, help="share to meet (0.9)"
    )
    ap.add_argument("--low", type=positive("--low"), help="first rate, req/s (workload.rate)")
    ap.add_argument("--high", type=positive("--high"), help="first upper rate (2 x low)")
    ap.add_argument(
        "--tolerance", type=positive("--tolerance"), default=0.05, help="(high-low)/low (0.05)"
    )
    ap.add_argument("--growth", type=positive("--growth"), default=2.0, help="bracket factor (2)")
    ap.add_argument("--max-probes", type=cli.positive_int, default=20, help="runs at most (20)")
    ap.add_argument("--keep-runs", action="store_true", help="keep each probe's run folder")
    cli.add_out(ap, OUTPUTS / "goodput", "where the report goes (outputs/goodput)")
    cli.add_json(ap)
    cli.add_overrides(ap, "Hydra overrides of run.py (executor=simulated, workload=..., ...)")
    args = ap.parse_intermixed_args(argv)
    if args.attainment > 1:
        refuse(f"argument --attainment: must be in (0, 1]; got {args.attainment}")
    if args.growth <= 1:
        refuse(f"argument --growth: must be > 1; got {args.growth}")
    if args.low is not None and args.high is not None and args.low >= args.high:
        refuse(f"argument --low ({args.low}) must be below --high ({args.high})")
    return args


def profile_label(profile: dict[str, Any], host_time: str) -> str:
    """What the seconds are: simulated, and on which profile."""
    parts = [f"cost model {profile.get('cost_model', '?')}", f"profile {profile.get('profile')}"]
    if profile.get("hardware"):
        parts.append(
            f"hardware {profile['hardware']} at tensor parallel {profile.get('tensor_parallel', 1)}"
        )
    return f"simulated seconds: {', '.join(parts)}, executor.host_time={host_time}"


def goodput_line(r: GoodputResult, ttft_s: float, tpot_s: float) -> str:
    """The headline, e.g. `goodput 6.2 req/s (bracket [6.2, 6.5]) at attainment 0.9 of ...`."""
    slo = f"attainment {r.target:g} of TTFT <= {ttft_s:g} s and TPOT <= {tpot_s:g} s"
    lo, hi = cell(r.low), cell(r.high)
    if r.status == "below":
        return f"goodput below {hi} req/s (no probe met {slo}; lowest probed {hi} req/s)"
    if r.status == "above":
        return (
            f"goodput at least {lo} req/s (every probe met {slo}, up to {lo} req/s: raise "
            "--max-probes, or the request count (workload.limit, workload.num_requests) if "
            "too few requests cannot load the config)"
        )
    note = "" if r.status == "converged" else ", not within the tolerance: out of probes"
    return f"goodput {lo} req/s (bracket [{lo}, {hi}]{note}) at {slo}"


def sustained_warning(rows: list[dict[str, Any]], goodput: float | None) -> str | None:
    """A warning when the run at the goodput served well under its offered rate (see
    `SUSTAINED`): then more requests, not a finer search, may change the answer."""
    row = next((r for r in rows if r["rate_rps"] == goodput), None)
    if row is None or row["served_ratio"] >= SUSTAINED:
        return None
    return (
        f"at the goodput the run served {row['throughput_rps']:.4g} req/s of the "
        f"{row['rate_rps']:.4g} offered ({row['served_ratio']:.0%}): either its "
        f"{row['requests']} requests piled up and were served after the arrivals ended, and "
        "this goodput then holds for a burst of that many requests, not for a sustained "
        "load, or the last requests' long outputs drew the run out; check that it holds "
        "with twice the requests (workload.limit, workload.num_requests)"
    )


def report(
    args: argparse.Namespace, prober: Prober, result: GoodputResult, cfg: DictConfig
) -> dict[str, Any]:
    """The search as one JSON-ready object."""
    replicas = int(cfg.cluster.replicas)
    tp = int(prober.profile.get("tensor_parallel", 1))
    gpus = replicas * tp if prober.profile.get("hardware") else None
    return {
        "goodput_rps": result.goodput,
        "bracket": [result.low, result.high],
        "status": result.status,
        "line": goodput_line(result, args.ttft, args.tpot),
        "warning": sustained_warning(prober.rows, result.goodput),
        "ttft_s": args.ttft,
        "tpot_s": args.tpot,
        "attainment": args.attainment,
        "tolerance": args.tolerance,
        "replicas": replicas,
        "gpus": gpus,
        "goodput_per_gpu_rps": result.goodput / gpus if gpus and result.goodput else None,
        "seconds": profile_label(prober.profile, str(cfg.executor.host_time)),
        **{k: prober.profile.get(k) for k in PROFILE_KEYS},
        "workload": OmegaConf.to_container(cfg.workload, resolve=True),
        "command": cli.command_line("goodput", args.argv),
        "probes": prober.rows,
    }


def write_report(out: Path, data: dict[str, Any]) -> str:
    """goodput.md, goodput.csv and goodput.json into `out`; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(data["probes"], key=lambda r: r["rate_rps"])
    write_csv(rows, COLUMNS, out / "goodput.csv")
    (out / "goodput.json").write_text(json.dumps(data, indent=2) + "\n")
    tags = environment_tags()
    headline = f"**{data['line']}**"
    if data["goodput_per_gpu_rps"]:
        gpus = data["gpus"]
        per_gpu = cell(data["goodput_per_gpu_rps"])
        least = "at least " * (data["status"] == "above")
        headline += f"; {least}{per_gpu} req/s per GPU over {gpus} GPU{'s' * (gpus > 1)}"
    requests = rows[0]["requests"] if rows else 0
    about = (
        f"Every time is in {data['seconds']}. Attainment: the share of all {requests} "
        f"requests that finished with TTFT <= {data['ttft_s']:g} s and TPOT <= "
        f"{data['tpot_s']:g} s (one output token: TTFT alone), and ttft_met / tpot_met the "
        "share that met each target alone; the percentiles are over the "
        "finished requests; served_ratio: requests finished per second of makespan over the "
        f"offered rate. Search: {data['status']}, tolerance {data['tolerance']:g}; every "
        "probe below, by rate (column `probe`: the order made). Searched on "
        f"{tags['machine.cpu']}, commit {tags['git.commit'][:10]}."
    )
    warning = [f"**Warning:** {data['warning']}.", ""] if data["warning"] else []
    lines = ["# Goodput", "", f"`{data['command']}`", "", headline, "", *warning, about, ""]
    text = "\n".join([*lines, markdown_table(rows, COLUMNS), ""])
    (out / "goodput.md").write_text(text)
    return text


def search(args: argparse.Namespace) -> dict[str, Any]:
    """Check the config, run the search, write the report; the report as an object."""
    overrides = [*BASE, *args.overrides]
    cfg = compose_config(overrides)
    rate = check_config(cfg)
    low = args.low if args.low is not None else (args.high / 2 if args.high else rate)
    high = args.high if args.high is not None else 2 * low
    if low >= high:
        refuse(f"argument --high ({high:g}) must be above the first rate ({low:g})")
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.out / "runs" if args.keep_runs else Path(tmp)
        prober = Prober(overrides, (args.ttft, args.tpot), args.attainment, runs)
        result = find_goodput(
            prober,
            low,
            high,
            args.attainment,
            args.tolerance,
            growth=args.growth,
            max_probes=args.max_probes,
        )
    data = report(args, prober, result, cfg)
    text = write_report(args.out, data)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(text)
        print(f"wrote {args.out / 'goodput.md'}, goodput.csv, goodput.json")
    return data


def main(argv: list[str] | None = None) -> int:
    """The command: 0 when the search ran, 2 with one `error:` line for a user's mistake."""
    try:
        args = parse(argv)
        args.argv = argv
        search(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
