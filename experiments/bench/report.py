"""The benchmark's report: the performance targets against what a run measured, per dtype,
the machine section, the result tables (`benchmark.md`, `benchmark.csv`), and the MLflow
metrics.

Kept apart from `benchmark.py`, which runs the systems: this module only formats and files
numbers that are already measured.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from experiments.bench.http_peers import server_lines
from experiments.bench.probe import Probe
from experiments.toolkit.config import REFERENCE
from experiments.toolkit.report import write_rounded_csv

COLUMNS = (
    "system",
    "dtype",
    "scheduler",
    "allocator",
    "output",
    "workload",
    "requests",
    "output_tokens",
    "wall_s",
    "tokens_per_s",
    "requests_per_s",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "host_overhead_share",
    "outputs_equal",
    "ratio_vs_hf_static",
    "ratio_vs_hf_cb",
    "ratio_vs_llamacpp",
    "host_overhead_share_b8",
    "linear_alone_s",
    "ties",
    "note",
)
TARGETS = {  # the goals, per dtype: name -> (goal, its test of the measured value, its unit)
    "throughput vs hf_static, queued Azure slice": (">= 2.5x", lambda v, _: v >= 2.5, "x"),
    "throughput vs hf_cb, queued Azure slice": (">= 2x", lambda v, _: v >= 2.0, "x"),
    "throughput vs hf_static, 48 chat prompts": (">= 2.5x", lambda v, _: v >= 2.5, "x"),
    "throughput vs hf_cb, 48 chat prompts": (">= 2x", lambda v, _: v >= 2.0, "x"),
    "time outside the Linear layers, largest-batch decode step": (
        "<= 20% (fp32), <= 30% (bf16)",
        lambda v, dtype: v <= (0.30 if dtype == "bfloat16" else 0.20),
        "%",
    ),
    "batch-1 decode step vs its Linear layers": ("<= 1.3x", lambda v, _: v <= 1.3, "x"),
    "largest-batch throughput vs the Linear layers alone": (">= 60%", lambda v, _: v >= 0.6, "%"),
    "host overhead at batch 8": ("<= 5% of a step", lambda v, _: v <= 0.05, "%"),
    "paged vs dense forward at batch 8": ("<= 1.1x", lambda v, _: v <= 1.1, "x"),
    "batch-1 decode step vs bandwidth floor": ("<= 1.5x", lambda v, _: v <= 1.5, "x"),
    "largest-batch throughput vs compute ceiling": (">= 60%", lambda v, _: v >= 0.6, "%"),
}
ACROSS = {  # the goals across dtypes, in one run
    "default job, bfloat16 vs float32 tokens/s": (">= 1.5x", lambda v: v >= 1.5, "x"),
}


@dataclasses.dataclass
class Pass:
    """One dtype's share of a benchmark run."""

    dtype: str
    rows: list[dict[str, Any]]
    machine: Probe | None
    rate_note: str
    default_job_tps: float | None
    kernels: dict[str, str]  # what the executor chose on this machine (its `describe()`)


def is_reference(row: dict[str, Any]) -> bool:
    combo = (row["scheduler"], row["allocator"], row["output"])
    return row["system"] == "nanoserve" and combo == REFERENCE


def fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def azure_row(
    rows: list[dict[str, Any]], system: str, workload: str = "azure_closed"
) -> dict[str, Any]:
    """`workload`'s row of `system` ("reference" for nanoserve's), or {}."""
    for r in rows:
        if r["workload"] == workload and (
            is_reference(r) if system == "reference" else r["system"] == system
        ):
            return r
    return {}


def targets(rows: list[dict[str, Any]], machine: Probe | None) -> list[tuple[str, float | None]]:
    """(target, measured value) for each of TARGETS; None: not measured in this run."""
    ref = azure_row(rows, "reference")
    m = machine

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    chat = azure_row(rows, "reference", "chat48")
    values = [
        ref.get("ratio_vs_hf_static"),
        ref.get("ratio_vs_hf_cb"),
        chat.get("ratio_vs_hf_static"),
        chat.get("ratio_vs_hf_cb"),
        m.outside_linears_big if m else None,
        ratio(m.batch1_step_s, m.linears_in_b1_step_s) if m else None,
        ratio(m.largest_batch_tps, m.largest_batch / m.linears_big_s) if m else None,
        m.host_share_b8 if m else None,
        ratio(m.paged_b8_s, m.dense_b8_s) if m else None,
        ratio(m.batch1_step_s, m.floor_s) if m else None,
        ratio(m.largest_batch_tps, m.ceiling_tps) if m else None,
    ]
    return list(zip(TARGETS, values, strict=True))


def kernel_bounds(rows: list[dict[str, Any]], machine: Probe | None) -> dict[str, float]:
    """Each target's value had the engine cost nothing but its Linear layers (the same
    kernels, the same steps): the best any engine built on these kernels could reach. A bound
    short of the goal puts the goal out of reach of engine work on this machine."""
    out: dict[str, float] = {}
    for workload, label in (("azure_closed", "queued Azure slice"), ("chat48", "48 chat prompts")):
        ref = azure_row(rows, "reference", workload)
        for peer in ("hf_static", "hf_cb"):
            base = azure_row(rows, peer, workload)
            if ref.get("linear_alone_s") and base.get("wall_s"):
                out[f"throughput vs {peer}, {label}"] = base["wall_s"] / ref["linear_alone_s"]
    if machine is not None:
        m = machine
        out["batch-1 decode step vs bandwidth floor"] = m.linears_b1_s / m.floor_s
        big_tps = m.largest_batch / m.linears_big_s
        out["largest-batch throughput vs compute ceiling"] = big_tps / m.ceiling_tps
    return out


def shown(value: float | None, unit: str) -> str:
    if value is None:
        return "not measured"
    return f"{value * 100:.3g}%" if unit == "%" else f"{fmt(value)}x"


def target_lines(rows: list[dict[str, Any]], machine: Probe | None) -> list[str]:
    bounds = kernel_bounds(rows, machine)
    lines = [
        "| target | measured | goal | met | the Linear layers alone |",
        "|---|---|---|---|---|",
    ]
    dtype = machine.dtype if machine else ""
    for name, value in targets(rows, machine):
        goal, ok, unit = TARGETS[name]
        met = "n/a" if value is None else ("met" if ok(value, dtype) else "not met")
        if met == "not met" and name in bounds and not ok(bounds[name], dtype):
            met += ", out of reach: past the Linear layers alone"
        bound = shown(bounds[name], unit) if name in bounds else ""
        lines.append(f"| {name} | {shown(value, unit)} | {goal} | {met} | {bound} |")
    return lines


def machine_lines(m: Probe | None) -> list[str]:
    if m is None:
        return ["(skipped: --no-probe)"]
    b1 = m.batch1_step_s
    paged = m.paged_b8_s and m.paged_b8_s * 1e3
    dense = m.dense_b8_s and m.dense_b8_s * 1e3
    stock = m.stock_b8_s and m.stock_b8_s * 1e3
    items = [
        ("threads", m.threads),
        ("memory bandwidth (read), GB/s", m.bandwidth_gbs),
        (f"{m.dtype} matmul, GFLOP/s", m.matmul_gflops),
        ("decode weights, MB / parameters", f"{m.weight_bytes / 1e6:.4g} / {m.weight_params}"),
        ("batch-1 decode step, ms", fmt(b1 and b1 * 1e3)),
        ("bandwidth floor (weights / bandwidth), ms", m.floor_s * 1e3),
        ("the Linear layers alone at batch 1 (weights cold), ms", m.linears_b1_s * 1e3),
        (
            "the Linear layers inside a batch-1 decode step (timed in place), ms",
            fmt(m.linears_in_b1_step_s and m.linears_in_b1_step_s * 1e3),
        ),
        (f"batch-{m.largest_batch} decode, tokens/s", m.largest_batch_tps),
        ("compute ceiling (matmul / 2 x parameters), tokens/s", m.ceiling_tps),
        (
            f"the Linear layers alone at batch {m.largest_batch}, tokens/s",
            m.largest_batch / m.linears_big_s,
        ),
        (
            "batch-8 forward, ms: paged (engine) / dense (HF DynamicCache, engine's Linear)",
            f"{fmt(paged)} / {fmt(dense)}",
        ),
        ("batch-8 forward of plain HF (dense, stock Linear), ms", fmt(stock)),
        (
            f"batch-{m.largest_batch} decode step, ms",
            fmt(m.largest_step_s and m.largest_step_s * 1e3),
        ),
        (f"outside the Linear layers at batch {m.largest_batch}, share", m.outside_linears_big),
        ("host overhead at batch 8, share of a step", m.host_share_b8),
    ]
    return ["| probe | value |", "|---|---|"] + [f"| {k} | {fmt(v)} |" for k, v in items]


def result_lines(rows: list[dict[str, Any]]) -> list[str]:
    cols = [c for c in COLUMNS if c != "workload"]
    lines: list[str] = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        lines += ["", f"### {workload}", "", "| " + " | ".join(cols) + " |"]
        lines.append("|" + "---|" * len(cols))
        lines += [
            "| " + " | ".join(fmt(r[c]) for c in cols) + " |"
            for r in rows
            if r["workload"] == workload
        ]
    return lines


def across(passes: list[Pass], ratios: list[float]) -> list[tuple[str, float | None]]:
    """The goals across dtypes: bf16's default job over fp32's (the median of the rounds'
    ratios, each round running both), when both ran in that order."""
    pair = [p.dtype for p in passes] == ["float32", "bfloat16"]
    return [
        (
            "default job, bfloat16 vs float32 tokens/s",
            float(statistics.median(ratios)) if pair and ratios else None,
        )
    ]


def across_lines(passes: list[Pass], ratios: list[float]) -> list[str]:
    lines = ["| target | measured | goal | met |", "|---|---|---|---|"]
    for name, value in across(passes, ratios):
        goal, ok, unit = ACROSS[name]
        met = "n/a" if value is None else ("met" if ok(value) else "not met")
        lines.append(f"| {name} | {shown(value, unit)} | {goal} | {met} |")
    jobs = ", ".join(f"{p.dtype} {fmt(p.default_job_tps)}" for p in passes if p.default_job_tps)
    if jobs:
        spread = f" (rounds: {', '.join(f'{r:.3g}x' for r in ratios)})" if ratios else ""
        lines += ["", f"Default job tokens/s, median of alternating rounds: {jobs}{spread}."]
    return lines


def write(
    out: Path, passes: list[Pass], header: dict[str, str], ratios: list[float] | None = None
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "benchmark.csv", out / "benchmark.md"
    rows = [r for p in passes for r in p.rows]
    write_rounded_csv(csv_path, COLUMNS, rows)
    lines = ["# nanoserve benchmark", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    if len(passes) > 1 or any(p.default_job_tps for p in passes):
        lines += ["", "## Across dtypes", "", *across_lines(passes, ratios or [])]
    for p in passes:
        lines += ["", f"## {p.dtype}: machine", "", *machine_lines(p.machine)]
        lines += ["", f"## {p.dtype}: targets", "", *target_lines(p.rows, p.machine)]
        servers = server_lines(p.rows)
        if servers:
            lines += ["", f"## {p.dtype}: servers, one HTTP client", "", *servers]
        lines += ["", f"## {p.dtype}: results", ""]
        lines += ["Seconds; tokens/s and requests/s over the wall time."]
        lines += result_lines(p.rows)
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def headline(passes: list[Pass], ratios: list[float] | None = None) -> dict[str, float]:
    """The MLflow metrics: each dtype's targets, tokens/s per system and probe values,
    prefixed by the dtype; the goals across dtypes unprefixed."""
    out: dict[str, float] = {}

    def key(text: str) -> str:
        return text.replace(" ", "_").replace(",", "")

    for name, v in across(passes, ratios or []):
        if v is not None:
            out[key(name)] = v
    for p in passes:
        d = p.dtype
        named = targets(p.rows, p.machine)
        out |= {f"{d}/{key(k)}": v for k, v in named if v is not None}
        if p.default_job_tps:
            out[f"{d}/default_job/tokens_per_s"] = p.default_job_tps
        for r in p.rows:
            name = "/".join(
                x for x in (r["system"], r["scheduler"], r["allocator"], r["output"]) if x
            )
            if r["tokens_per_s"] is not None:
                out[f"{d}/{r['workload']}/{name}/tokens_per_s"] = r["tokens_per_s"]
        if p.machine is not None:
            probe = dataclasses.asdict(p.machine)
            out |= {
                f"{d}/{k}": v
                for k, v in probe.items()
                if isinstance(v, int | float) and v is not None
            }
    return out
