"""Fit a GPU's kernel families to a published per-operator table, its prefill attention to
an attention table, and its interconnect's all-reduce to a collective table; write them into
the GPU's hardware spec.

    python -m experiments.gpu_fit ../shared/data/gpu/h100/Llama-2-7b-hf.mlp.csv \\
        --hardware h100-sxm [--also h200] \\
        [--collective ../shared/data/gpu/network/h100_dgx.all_reduce.csv --interconnect dgx] \\
        [--attention ATTENTION.csv] [--write]

The GEMM family (seven parameters, `framework/executors/simulated/gpu/kernels.py`) is fitted
jointly to the table's four projections, each streaming family (two parameters) to its own
operators, all in log space (relative error) with scipy's least squares. All-reduce is one
alpha-beta pair per worker count, fitted to messages of 1 MB and up (below that the tables'
medians scatter from one size to the next). Without `--write` it prints the fitted
block; with it, the block replaces the spec's `kernels:` (and the named interconnect). A
table with no operator of a streaming family (a measured table may leave one out) keeps the
spec's earlier fit of that family, and `fitted_on` names the families kept.

Prefill attention (`--attention`, Vidur's `attention.csv` format) is two parameters
(`kernels.PrefillAttentionFit`: a fraction of the peak and a cost per key of the context),
fitted in log space to the table's whole prompts (nothing cached) at TP 1, the spec's own
`attention.fixed_s` held; its other rows (other TP degrees, chunks over a cached prefix) are
left to `experiments.gpu_check` to judge. Without `--attention` a spec keeps the prefill
attention fit it has; a spec with none prices prefill at its `attention.prefill` fraction.
The decode efficiency and the fixed cost are published figures the spec states, cited.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

from framework.calibration.gpu_tables import (
    TABLE_DTYPE_BYTES,
    AttentionTable,
    CollectiveTable,
    OperatorTable,
    TableError,
    read_attention_table,
    read_collective_table,
    read_operator_table,
)
from framework.executors.simulated.gpu.hardware import hardware_spec_path
from framework.executors.simulated.gpu.kernels import (
    STREAM_FAMILIES,
    AllReduceFit,
    AttentionFit,
    GemmFit,
    PrefillAttentionFit,
    StreamFit,
)
from framework.executors.simulated.gpu.shard import Device, Gemm, Stream, layer_shapes
from framework.tracking.tool_run import command_line

GEMM_START = (5e-6, 0.9, 0.75, 64.0, 2.0, 64.0, 0.5)
GEMM_BOUNDS = ((0, 0.1, 0.1, 0, 1, 8, 0), (1e-4, 1.0, 1.0, 5000, 20, 256, 1))
MIN_COLLECTIVE_BYTES = 1e6
ATTENTION_FIT_TP = 1  # the attention table's rows fitted on; its other degrees are held apart


def device_of(spec: dict[str, Any], dtype: str = "float16") -> Device:
    return Device(
        bandwidth=float(spec["memory_bandwidth"]),
        peak=float(spec["peak_flops"][dtype]),
        sms=int(spec["sms"]),
        dtype_bytes=TABLE_DTYPE_BYTES,
    )


def table_shapes(table: OperatorTable) -> dict[str, list[Gemm | Stream]]:
    """Each of the table's operators, row by row, as `layer_shapes` writes it (fp16)."""
    rows = [
        layer_shapes(table.shard(i), int(m), TABLE_DTYPE_BYTES) for i, m in enumerate(table.tokens)
    ]
    return {op: [r[op] for r in rows] for op in table.operators}


def fit_gemm(table: OperatorTable, dev: Device) -> GemmFit:
    """The GEMM family, fitted jointly to every projection of the table."""
    shapes = table_shapes(table)
    m = table.tokens
    # an operator is a GEMM at every row or at none (`layer_shapes`)
    gemms = {op: [g for g in shapes[op] if isinstance(g, Gemm)] for op in table.operators}
    ops = [op for op in table.operators if gemms[op]]

    def residuals(x: np.ndarray) -> np.ndarray:
        fit = GemmFit(*x)
        out = []
        for op in ops:
            pred = np.array(
                [
                    fit.seconds(mi, g.n, g.k, TABLE_DTYPE_BYTES, dev.bandwidth, dev.peak, dev.sms)
                    for mi, g in zip(m, gemms[op], strict=True)
                ]
            )
            out.append(np.log(pred / table.seconds[op]))
        return np.concatenate(out)

    found = least_squares(residuals, GEMM_START, bounds=GEMM_BOUNDS)
    return GemmFit(*(float(v) for v in found.x))


def fit_stream(table: OperatorTable, dev: Device) -> dict[str, StreamFit]:
    """Each streaming family the table has operators of, fitted to those operators."""
    shapes = table_shapes(table)
    # an operator streams at every row or at none (`layer_shapes`)
    streams = {op: [s for s in shapes[op] if isinstance(s, Stream)] for op in table.operators}
    out = {}
    for family in STREAM_FAMILIES:
        ops = [op for op in table.operators if streams[op] and streams[op][0].family == family]
        if not ops:
            continue
        nbytes = np.array([s.nbytes for op in ops for s in streams[op]])
        measured = np.concatenate([table.seconds[op] for op in ops])

        def residuals(x: np.ndarray, nbytes: np.ndarray = nbytes, y: np.ndarray = measured):
            return np.log((x[0] + nbytes / (dev.bandwidth * x[1])) / y)

        found = least_squares(residuals, (2e-6, 0.5), bounds=((0, 0.01), (1e-4, 1.0)))
        out[family] = StreamFit(float(found.x[0]), float(found.x[1]))
    return out


def merged_stream(
    fitted: dict[str, StreamFit], spec: dict[str, Any], table: Path
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The fitted families, and the spec's own fit for each family the table has no operator
    of (a measured table may leave out an operator whose kernel it cannot time as a serving
    engine runs it). Returns the merged block and the families kept."""
    before = ((spec.get("kernels") or {}).get("stream")) or {}
    kept = [f for f in STREAM_FAMILIES if f not in fitted]
    missing = [f for f in kept if f not in before]
    if missing:
        raise TableError(
            f"{table}: no operator for the {', '.join(missing)} famil"
            f"{'y' if len(missing) == 1 else 'ies'}, and the spec has no fit of it to keep"
        )
    return {f: fitted[f].to_dict() if f in fitted else before[f] for f in STREAM_FAMILIES}, kept


def fit_all_reduce(table: CollectiveTable) -> AllReduceFit:
    latency, bus = {}, {}
    for n in sorted(set(table.workers.tolist())):
        keep = (table.workers == n) & (table.nbytes >= MIN_COLLECTIVE_BYTES)
        if keep.sum() < 2:
            raise TableError(f"{table.path}: fewer than two messages of 1 MB and up at {n} workers")
        ring = 2 * (n - 1) / n * table.nbytes[keep]
        y = table.seconds[keep]

        def residuals(x: np.ndarray, ring: np.ndarray = ring, y: np.ndarray = y) -> np.ndarray:
            return np.log((x[0] * 1e-6 + ring / (x[1] * 1e9)) / y)

        found = least_squares(residuals, (10.0, 100.0), bounds=((0, 1), (1e4, 1e5)))
        latency[n], bus[n] = float(found.x[0] * 1e-6), float(found.x[1] * 1e9)
    return AllReduceFit(latency, bus)


def fit_prefill_attention(
    table: AttentionTable, attention: AttentionFit, peak: float
) -> PrefillAttentionFit:
    """The prefill attention form, fitted to the table's whole prompts at TP 1 (the
    rows the simulator's causal count is exact for), `attention.fixed_s` held. The cost per
    key is fitted in nanoseconds, so both parameters are of order one to the solver."""
    keep = table.fresh & (table.tp == ATTENTION_FIT_TP)
    if keep.sum() < 2:
        raise TableError(
            f"{table.path}: fewer than two whole prompts (kv_cache_size 0) at TP {ATTENTION_FIT_TP}"
        )
    flops, context, y = table.flops()[keep], table.context[keep], table.seconds[keep]

    def residuals(x: np.ndarray) -> np.ndarray:
        predicted = attention.fixed_s + flops / (peak * x[0]) + x[1] * 1e-9 * context
        return np.log(predicted / y)

    found = least_squares(residuals, (0.5, 10.0), bounds=((0.05, 0.0), (1.0, 1e4)))
    rows = int(keep.sum())
    shape = f"{int(table.heads[keep][0])} heads of {int(table.head_dim[keep][0])}"
    return PrefillAttentionFit(
        compute=float(found.x[0]),
        per_key_s=float(found.x[1]) * 1e-9,
        fitted_on=f"{table.path.name} ({rows} whole prompts at TP {ATTENTION_FIT_TP}, {shape})",
    )


MARKER = "# --- fitted by experiments.gpu_fit"


def rounded(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: rounded(v) for k, v in data.items()}
    if isinstance(data, float):
        return float(f"{data:.5g}")
    return data


def spec_block(spec: dict[str, Any], commands: list[str]) -> str:
    """The fitted part of a spec file: its kernels and interconnects, after the marker and
    the command(s) that remake them, in order."""
    fitted = {k: spec[k] for k in ("kernels", "interconnects") if k in spec}
    body = yaml.safe_dump(rounded(fitted), sort_keys=False, width=100)
    which = "the command" if len(commands) == 1 else "the commands, in order"
    lines = "".join(f"# {c}\n" for c in commands)
    return f"{MARKER} (do not edit below; remake with {which}):\n{lines}{body}"


def earlier_commands(path: Path) -> list[str]:
    """The commands a spec's fitted block names: a fit of the attention alone keeps them,
    since the kernels it keeps are theirs."""
    text = path.read_text(encoding="utf-8")
    if MARKER not in text:
        return []
    out = []
    for line in text.split(MARKER, 1)[1].splitlines()[1:]:
        if not line.startswith("# "):
            break
        out.append(line[2:])
    return out


def write_spec(path: Path, spec: dict[str, Any], commands: list[str]) -> None:
    text = path.read_text(encoding="utf-8")
    head = text.split(MARKER)[0].rstrip("\n")
    path.write_text(f"{head}\n{spec_block(spec, commands)}", encoding="utf-8")


def kernels_block(
    spec: dict[str, Any],
    fitted: tuple[GemmFit, dict[str, StreamFit]] | None,
    prefill: PrefillAttentionFit | None,
    table: Path | None,
    measured_on: str,
) -> dict[str, Any]:
    """A spec's new `kernels:`: the GEMM and streaming fits of `table` (or the spec's own,
    kept, when only the attention is fitted), and the prefill attention fit (or the spec's
    own, kept, when no attention table is given)."""
    before = spec.get("kernels") or {}
    if fitted is None or table is None:
        if not before:
            raise TableError("the spec has no fitted kernels to keep: give a per-operator table")
        kernels = dict(before)
    else:
        gemm, stream = fitted
        merged, kept = merged_stream(stream, spec, table)
        fitted_on = f"{table.parent.name}/{table.name} ({measured_on})"
        if kept:
            fitted_on += f"; {', '.join(kept)} kept from the spec's earlier fit"
        kernels = {"fitted_on": fitted_on, "gemm": gemm.to_dict(), "stream": merged}
        if "prefill_attention" in before:
            kernels["prefill_attention"] = before["prefill_attention"]
    if prefill is not None:
        kernels["prefill_attention"] = prefill.to_dict()
    return kernels


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "table",
        type=Path,
        nargs="?",
        help="a per-operator table (Vidur's *.mlp.csv format); left out, the spec keeps its "
        "kernels and only --attention (and --collective) are fitted",
    )
    ap.add_argument(
        "--hardware",
        required=True,
        help="the GPU the table was measured on (a shipped spec's name or a file)",
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        help="another spec given the same fitted fractions (a GPU of the same "
        "compute die, such as the H200 for the H100); repeatable",
    )
    ap.add_argument(
        "--collective",
        type=Path,
        action="append",
        default=[],
        help="an all-reduce table; repeatable, one per --interconnect",
    )
    ap.add_argument(
        "--interconnect",
        action="append",
        default=[],
        help="the node each --collective was measured on (dgx, nvlink_pair)",
    )
    ap.add_argument(
        "--attention",
        type=Path,
        help="an attention table (Vidur's attention.csv format) measured on --hardware: fit "
        "its prefill attention, given to every spec written as the kernels are",
    )
    ap.add_argument("--write", action="store_true", help="write the fit into the spec file(s)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if len(args.collective) != len(args.interconnect):
        print("error: give one --interconnect for each --collective", file=sys.stderr)
        return 2
    if args.table is None and args.attention is None:
        print("error: give a per-operator table, an --attention table or both", file=sys.stderr)
        return 2
    command = command_line("gpu_fit", argv)
    try:
        links = {
            name: fit_all_reduce(read_collective_table(path))
            for path, name in zip(args.collective, args.interconnect, strict=True)
        }
        measured_on = yaml.safe_load(hardware_spec_path(args.hardware).read_text("utf-8"))
        dev = device_of(measured_on)
        fitted = None
        if args.table is not None:
            table = read_operator_table(args.table)
            fitted = fit_gemm(table, dev), fit_stream(table, dev)
        prefill = None
        if args.attention is not None:
            prefill = fit_prefill_attention(
                read_attention_table(args.attention),
                AttentionFit.from_dict(measured_on.get("attention"), f"{args.hardware}.attention"),
                dev.peak,
            )
        for hardware in [args.hardware, *args.also]:
            path = hardware_spec_path(hardware)
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
            spec["kernels"] = kernels_block(spec, fitted, prefill, args.table, measured_on["name"])
            if links:
                spec["interconnects"] = {
                    **(spec.get("interconnects") or {}),
                    **{k: v.to_dict() for k, v in links.items()},
                }
            commands = [command]
            if args.table is None:  # the kernels kept are the earlier commands' fit
                commands = [c for c in earlier_commands(path) if c != command] + commands
            if args.write:
                write_spec(path, spec, commands)
                print(f"wrote the fit into {path}")
            else:
                print(spec_block(spec, commands))
    except (TableError, ValueError, OSError) as exc:  # ProfileError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
