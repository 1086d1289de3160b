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

This module is the command and its report; the search is `goodput_search`, its probes
`goodput_probes`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from framework.run.errors import UserError
from framework.run.paths import OUTPUTS
from framework.studies.goodput_probes import COLUMNS, PROFILE_KEYS, Prober, search
from framework.studies.goodput_search import GoodputResult
from framework.tracking.tables import cell, markdown_table, write_csv
from framework.tracking.tags import environment_tags
from framework.tracking.tool_run import command_line

# Below this share of the offered rate served (finished requests / makespan over the rate),
# the run at the goodput may not have kept up: requests that piled up and were served after
# the arrivals ended make its attainment that of a burst of so many requests, not of a load
# the config sustains. A sustained run falls short of 1 by its drain alone (the last
# requests' latency against the arrivals' span), which long outputs lengthen too: a hint to
# check, not a verdict.
SUSTAINED = 0.8
OUT = OUTPUTS / "goodput"  # where a search's report goes unless told


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


def positive_int(text: str) -> int:
    """An argument type: a whole number >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def refuse(message: str) -> NoReturn:
    """argparse's errors as one line (its own print a usage block first)."""
    raise UserError(f"{message}; python -m experiments.goodput --help lists the arguments")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
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
    ap.add_argument("--max-probes", type=positive_int, default=20, help="runs at most (20)")
    ap.add_argument("--keep-runs", action="store_true", help="keep each probe's run folder")
    ap.add_argument("--out", type=Path, default=OUT, help="where the report goes (outputs/goodput)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides of run.py (executor=simulated, workload=..., ...)",
    )
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
    prober: Prober,
    result: GoodputResult,
    cfg: DictConfig,
    tolerance: float,
    command: str,
) -> dict[str, Any]:
    """The search as one JSON-ready object (`cfg`: the config at its own rate; `command`:
    what was asked for, as its report quotes it)."""
    ttft_s, tpot_s = prober.slo
    replicas = int(cfg.cluster.replicas)
    tp = int(prober.profile.get("tensor_parallel", 1))
    gpus = replicas * tp if prober.profile.get("hardware") else None
    return {
        "goodput_rps": result.goodput,
        "bracket": [result.low, result.high],
        "status": result.status,
        "line": goodput_line(result, ttft_s, tpot_s),
        "warning": sustained_warning(prober.rows, result.goodput),
        "ttft_s": ttft_s,
        "tpot_s": tpot_s,
        "attainment": prober.target,
        "tolerance": tolerance,
        "replicas": replicas,
        "gpus": gpus,
        "goodput_per_gpu_rps": result.goodput / gpus if gpus and result.goodput else None,
        "seconds": profile_label(prober.profile, str(cfg.executor.host_time)),
        **{k: prober.profile.get(k) for k in PROFILE_KEYS},
        "workload": OmegaConf.to_container(cfg.workload, resolve=True),
        "command": command,
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


def search_and_report(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Run the search, write the report; the report as an object."""
    result, prober, cfg = search(
        args.overrides,
        args.ttft,
        args.tpot,
        attainment=args.attainment,
        low=args.low,
        high=args.high,
        tolerance=args.tolerance,
        growth=args.growth,
        max_probes=args.max_probes,
        runs_dir=args.out / "runs" if args.keep_runs else None,
    )
    data = report(prober, result, cfg, args.tolerance, command_line("goodput", argv))
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
        search_and_report(parse(argv), argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
