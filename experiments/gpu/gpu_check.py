"""Set the analytic GPU cost model against a published table of GPU times, row by row.

    python -m experiments.gpu_check FILE.csv --hardware h100-sxm [--json]
    python -m experiments.gpu_check ALL_REDUCE.csv --hardware h100-sxm --interconnect dgx [--json]
    python -m experiments.gpu_check ATTENTION.csv --hardware a100-80gb [--flat] [--json]

A per-operator table (Vidur's `*.mlp.csv` format, from any source) names its model shape and
tensor-parallel degree in its own columns; every row is predicted by the hardware spec's
fitted kernels (`framework/executors/simulated/gpu/`) and compared with its measured median:
per operator and for the layer (the sum of the operators in the file), as MAPE, median,
p90 and max of |predicted / measured - 1|, split by token range and by TP degree. A collective
table (its `collective` column) is predicted by the spec's all-reduce fit for the named
interconnect, and reported by worker count, for messages of 1 MB and up (and all sizes
apart). An attention table (Vidur's `attention.csv`: its `time_stats.attn_prefill.median`
column) has its prefill rows priced as the simulator prices a step of that one row (the
spec's fitted `prefill_attention`, or with `--flat` its flat `attention.prefill` fraction,
the model before such a fit) and reported by TP degree and prompt length, with the median
of predicted / measured; rows that extend a cached prefix (a chunk) apart. `--json` prints
the same as one JSON object, fractions not percentages.

Exit status: 0 on a readable file, whatever the errors; 2 (one `error:` line) on a malformed
file or an unknown spec.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from experiments.toolkit import cli
from framework.calibration.gpu_tables import (
    TABLE_DTYPE_BYTES,
    TableError,
    error_stats,
    predict_collective,
    predict_operators,
    predict_prefill_attention,
    read_attention_table,
    read_collective_table,
    read_operator_table,
)
from framework.executors.simulated.cost import ProfileError
from framework.executors.simulated.gpu.hardware import HardwareSpec, load_hardware_spec
from framework.executors.simulated.gpu.shard import Device

TOKEN_RANGES = ((1, 32), (33, 512), (513, 4096), (4097, None))
LARGE_MESSAGE = 1e6  # bytes: the all-reduce target holds from here up
PROMPT_RANGES = ((1, 1024), (1025, 2048), (2049, 4096), (4097, 8192), (8193, 16384), (16385, None))


def token_range(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi}" if hi else f"{lo}+"


def check_operators(path: Path, spec: HardwareSpec) -> dict[str, Any]:
    table = read_operator_table(path)
    device = Device(spec.memory_bandwidth, spec.peak("float16"), spec.sms, TABLE_DTYPE_BYTES)
    predicted = predict_operators(table, spec.kernels, device)
    layer_p = sum(predicted[op] for op in table.operators)
    layer_m = table.layer()
    tokens, tp = table.tokens, table.tp

    def split(mask_of: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
        return {k: error_stats(layer_p[m], layer_m[m]) for k, m in mask_of.items() if m.any()}

    ranges = {
        token_range(lo, hi): (tokens >= lo) & (tokens <= (hi or np.inf)) for lo, hi in TOKEN_RANGES
    }
    degrees = {str(int(n)): tp == n for n in sorted(set(tp.tolist()))}
    by_tp = {}
    for n, mask in degrees.items():
        by_tp[n] = {
            **error_stats(layer_p[mask], layer_m[mask]),
            "by_tokens": {
                k: error_stats(layer_p[mask & r], layer_m[mask & r])
                for k, r in ranges.items()
                if (mask & r).any()
            },
        }
    return {
        "table": str(path),
        "hardware": spec.id,
        "fitted_on": spec.kernels.fitted_on,
        "shape": {
            k: int(v[0])
            for k, v in table.shape.items()
            if k not in ("num_tokens", "num_tensor_parallel_workers")
        },
        "layer": error_stats(layer_p, layer_m),
        "by_tokens": split(ranges),
        "by_tp": by_tp,
        "by_op": {op: error_stats(predicted[op], table.seconds[op]) for op in table.operators},
    }


def check_collective(path: Path, spec: HardwareSpec, interconnect: str) -> dict[str, Any]:
    table = read_collective_table(path)
    if interconnect not in spec.interconnects:
        have = ", ".join(sorted(spec.interconnects)) or "none"
        raise ProfileError(f"--interconnect {interconnect}: {spec.id} has fits for {have}")
    fit = spec.interconnects[interconnect]
    unfitted = sorted(set(table.workers.tolist()) - set(fit.workers))
    fitted = np.isin(table.workers, fit.workers)
    if not fitted.any():
        raise ProfileError(
            f"--interconnect {interconnect}: no fit for {unfitted} workers "
            f"(has {list(fit.workers)})"
        )
    predicted = np.full(len(table.seconds), np.nan)
    predicted[fitted] = predict_collective(
        replace(
            table,
            workers=table.workers[fitted],
            nbytes=table.nbytes[fitted],
            seconds=table.seconds[fitted],
        ),
        fit,
    )
    large = (table.nbytes >= LARGE_MESSAGE) & fitted
    by_workers = {}
    for n in sorted(set(table.workers[fitted].tolist())):
        m = table.workers == n
        by_workers[str(n)] = {
            **error_stats(predicted[m & large], table.seconds[m & large]),
            "all_sizes": error_stats(predicted[m], table.seconds[m]),
        }
    return {
        "table": str(path),
        "hardware": spec.id,
        "interconnect": interconnect,
        "collective": error_stats(predicted[large], table.seconds[large]),
        "all_sizes": error_stats(predicted[fitted], table.seconds[fitted]),
        "by_workers": by_workers,
        "unfitted_workers": unfitted,  # rows of worker counts the fit has no times for
    }


def ratio_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """`error_stats` and the median of predicted / measured (below 1: the model reads
    fast)."""
    return {**error_stats(predicted, measured), "ratio": float(np.median(predicted / measured))}


def check_attention(path: Path, spec: HardwareSpec, flat: bool = False) -> dict[str, Any]:
    table = read_attention_table(path)
    fit = None if flat else spec.kernels.prefill_attention
    predicted = predict_prefill_attention(table, spec.attention, fit, spec.peak("float16"))
    measured, fresh = table.seconds, table.fresh
    by_tp = {}
    for n in sorted(set(table.tp.tolist())):
        rows = fresh & (table.tp == n)
        if not rows.any():
            continue
        by_length = {}
        for lo, hi in PROMPT_RANGES:
            m = rows & (table.queries >= lo) & (table.queries <= (hi or np.inf))
            if m.any():
                by_length[token_range(lo, hi)] = ratio_stats(predicted[m], measured[m])
        by_tp[str(int(n))] = {
            **ratio_stats(predicted[rows], measured[rows]),
            "heads_per_gpu": int(table.heads[rows][0] // n),
            "by_length": by_length,
        }
    chunked = ~fresh
    return {
        "table": str(path),
        "hardware": spec.id,
        "priced_by": (
            f"prefill_attention fitted on {fit.fitted_on}"
            if fit is not None
            else f"the flat attention.prefill fraction {spec.attention.prefill}"
        ),
        "prompts": ratio_stats(predicted[fresh], measured[fresh]) if fresh.any() else None,
        "by_tp": by_tp,
        "chunks": ratio_stats(predicted[chunked], measured[chunked]) if chunked.any() else None,
    }


def error_line(stats: dict[str, float]) -> str:
    """`error_stats` on one line, in percent."""
    return (
        f"MAPE {100 * stats['mape']:5.1f}%  median {100 * stats['median']:5.1f}%  "
        f"p90 {100 * stats['p90']:5.1f}%  max {100 * stats['max']:6.1f}%  ({stats['rows']} rows)"
    )


def print_attention(report: dict[str, Any]) -> None:
    def line(stats: dict[str, float]) -> str:
        return f"{error_line(stats)}  predicted/measured {stats['ratio']:.2f}"

    print(f"{report['table']}: prefill attention on {report['hardware']}")
    print(f"  priced by {report['priced_by']}")
    if report["prompts"]:
        print(f"  whole prompts      {line(report['prompts'])}")
    for n, stats in report["by_tp"].items():
        print(f"  TP {n} ({stats['heads_per_gpu']} heads a GPU) {line(stats)}")
        for k, band in stats["by_length"].items():
            print(f"    {k:<14} {line(band)}")
    if report["chunks"]:
        print(f"  chunks after a cached prefix {line(report['chunks'])}")


def print_report(report: dict[str, Any]) -> None:
    if "priced_by" in report:
        print_attention(report)
        return
    if "collective" in report:
        print(f"{report['table']}: all-reduce on {report['hardware']} / {report['interconnect']}")
        print(f"  messages >= 1 MB   {error_line(report['collective'])}")
        print(f"  all sizes          {error_line(report['all_sizes'])}")
        for n, stats in report["by_workers"].items():
            print(f"  {n} workers, >= 1 MB {error_line(stats)}")
        if report["unfitted_workers"]:
            print(f"  not predicted: {report['unfitted_workers']} workers (no fit for them)")
        return
    print(f"{report['table']}: {report['hardware']} (kernels fitted on {report['fitted_on']})")
    print(f"  shape {report['shape']}")
    print(f"  layer             {error_line(report['layer'])}")
    for k, stats in report["by_tokens"].items():
        print(f"  tokens {k:<10} {error_line(stats)}")
    for n, stats in report["by_tp"].items():
        print(f"  TP {n:<14} {error_line(stats)}")
    for op, stats in report["by_op"].items():
        print(f"  {op:<24} {error_line(stats)}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.parser(__doc__)
    ap.add_argument("table", type=Path, help="a per-operator or an all-reduce table (CSV)")
    cli.add_hardware(ap)
    cli.add_interconnect(ap, "for an all-reduce table: dgx, nvlink_pair")
    cli.add_json(ap)
    ap.add_argument(
        "--flat",
        action="store_true",
        help="for an attention table: price prefill at the spec's flat attention.prefill "
        "fraction, leaving out its fitted prefill_attention (the model before that fit)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        spec = HardwareSpec.from_dict(load_hardware_spec(args.hardware))
        with args.table.open(encoding="utf-8", errors="replace") as f:
            header = f.readline()
        columns = [c.strip() for c in header.split(",")]
        if "collective" in columns:
            report = check_collective(args.table, spec, args.interconnect)
        elif "time_stats.attn_prefill.median" in columns:
            report = check_attention(args.table, spec, flat=args.flat)
        else:
            report = check_operators(args.table, spec)
    except (TableError, ProfileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0
