"""The capacity search, `python -m experiments.goodput`: the highest request rate at which a
config meets an SLO (conditions on the run's metrics, DistServe's attainment, or both), found
by bisection on `workload.rate`, each probe one simulated run of the config.

The SLO is every condition given, of two kinds:

- `--slo METRIC<=X` (repeatable; `<`, `>=`, `>` too): a condition on the run's metrics, a key
  of its metrics.json with or without the `_s` (Sarathi-Serve's capacity: `--slo
  'scheduling_delay_p50<=2' --slo 'tbt_p99<=0.1'`; the DistServe blog's toy: `--slo
  'ttft_p90<=0.4' --slo 'tpot_p90<=0.04'`);
- `--ttft S --tpot S`: DistServe's per-request targets, met when at least `--attainment`
  (0.9) of ALL the requests finished with TTFT <= S and TPOT <= S, both in the same request.

    python -m experiments.goodput --ttft 0.005 --tpot 0.001 executor=simulated model=tiny \\
        workload=synthetic workload.num_requests=200
    python -m experiments.goodput --slo 'scheduling_delay_p50<=2' --slo 'tbt_p99<=0.1' \\
        executor=simulated model=tiny workload=synthetic workload.num_requests=200

TPOT is (finish - first token) / (output tokens - 1); a request of one output token has no
TPOT and is judged on its TTFT alone; a rejected or unfinished request misses. A condition on
a metric no request defined (None) fails. The search first brackets the goodput (`--high`
grows by `--growth` while it still meets the SLO, `--low` shrinks while it does not), then
bisects (geometric midpoints) until (high - low) / low <= `--tolerance`, within
`--max-probes` runs in all. The goodput is the highest rate probed that met the SLO, and every
probe is reported. Overrides are Hydra overrides of `run.py`; the config must be
`executor=simulated` (the probes then cost seconds and repeat exactly) and its workload must
take a rate in requests/s (`synthetic`, `shared_prefix`, or `trace` under a generated arrival
process such as `workload=azure_conv_poisson` or `arxiv_poisson`). Under
`executor.host_time=model`, which this tool sets unless overridden, every figure is in
simulated seconds of the profile the runs name (`cost_model`, `profile`, `hardware`), never
this machine's. Writes `goodput.md`, `goodput.csv`, `goodput.json` and `goodput.png` into
`--out` and logs the search to MLflow (`--no-mlflow`: not); `--json` prints the JSON instead
of the table.

This module is the command; the search is `goodput_search`, its probes `goodput_probes`, its
conditions `slo`, its report `goodput_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from framework.run.errors import UserError
from framework.run.paths import OUTPUTS
from framework.studies.goodput_probes import search
from framework.studies.goodput_report import draw_probes, log_search, report, write_report
from framework.studies.slo import parse_condition
from framework.tracking.tool_run import command_line

__all__ = ["OUT", "main", "report", "write_report"]  # (the notebook's, and the command)

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
    ap.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="'METRIC<=X'",
        help="a condition on the run's metrics (<=, <, >=, >; repeatable; quote it)",
    )
    ap.add_argument("--ttft", type=positive("--ttft"), help="per-request TTFT target, s")
    ap.add_argument("--tpot", type=positive("--tpot"), help="per-request TPOT target, s")
    ap.add_argument(
        "--attainment",
        type=positive("--attainment"),
        help="share of requests to meet --ttft and --tpot (0.9)",
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
    ap.add_argument("--no-mlflow", action="store_true", help="write the files only")
    ap.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides of run.py (executor=simulated, workload=..., ...)",
    )
    args = ap.parse_intermixed_args(argv)
    args.conditions = [parse_condition(text, "--slo") for text in args.slo]
    if (args.ttft is None) != (args.tpot is None):
        given, missing = ("--ttft", "--tpot") if args.tpot is None else ("--tpot", "--ttft")
        refuse(
            f"argument {given} needs {missing}: they are DistServe's per-request targets and "
            "go together; for one latency alone use a condition on its percentile, e.g. "
            "--slo 'ttft_p90<=0.4'"
        )
    if args.ttft is None and not args.conditions:
        refuse(
            "no SLO: give --slo 'METRIC<=X' (a condition on the run's metrics, repeatable), "
            "--ttft S --tpot S (DistServe's per-request targets), or both"
        )
    if args.attainment is None:
        args.attainment = 0.9
    elif args.ttft is None:
        refuse("argument --attainment: it is the share of requests to meet --ttft and --tpot")
    if args.attainment > 1:
        refuse(f"argument --attainment: must be in (0, 1]; got {args.attainment}")
    if args.growth <= 1:
        refuse(f"argument --growth: must be > 1; got {args.growth}")
    if args.low is not None and args.high is not None and args.low >= args.high:
        refuse(f"argument --low ({args.low}) must be below --high ({args.high})")
    return args


def search_and_report(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Run the search, write the report, log it; the report as an object."""
    result, prober, cfg = search(
        args.overrides,
        args.ttft,
        args.tpot,
        attainment=args.attainment,
        conditions=args.conditions,
        low=args.low,
        high=args.high,
        tolerance=args.tolerance,
        growth=args.growth,
        max_probes=args.max_probes,
        runs_dir=args.out / "runs" if args.keep_runs else None,
    )
    # Quoted as a shell needs it: a condition's `<` or `>` would be a redirection.
    typed = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)]
    data = report(prober, result, cfg, args.tolerance, command_line("goodput", typed))
    text = write_report(args.out, data)
    draw_probes(data, args.out / "goodput.png")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(text)
        print(f"wrote {args.out / 'goodput.md'}, goodput.csv, goodput.json, goodput.png")
    if not args.no_mlflow:
        files = [args.out / f"goodput.{ext}" for ext in ("md", "csv", "json", "png")]
        # Under --json, stdout is the JSON alone: what the store says goes to stderr.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            log_search(cfg, args, files, data)
    return data


def main(argv: list[str] | None = None) -> int:
    """The command: 0 when the search ran, 2 with one `error:` line for a user's mistake."""
    try:
        search_and_report(parse(argv), argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
