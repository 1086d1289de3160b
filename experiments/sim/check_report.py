"""The simulator check's report: the tallies against the targets, the tables, the files, and
the MLflow parent run with a child per case."""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from experiments.sim.check_noise import section as twins_section
from experiments.sim.check_rows import (
    COLUMNS,
    COUNTS,
    MET,
    METRICS,
    NOT_MET,
    PAIR_COLUMNS,
    SPREAD,
    STEP_COLUMNS,
)
from experiments.toolkit.report import num, percent
from framework.tracking.tables import markdown_table, write_csv
from framework.tracking.tool_run import ChildRun, log_run


def counts_cell(row: dict[str, Any], k: str) -> str:
    a, b = row[f"{k}_real"], row[f"{k}_sim"]
    return str(a) if a == b else f"{a} / {b}"


def metric_cell(row: dict[str, Any], m: str) -> str:
    """`real / sim, error (spread) verdict` in one cell."""
    v = row[f"{m}_verdict"]
    short = {MET: "met", SPREAD: "in spread", NOT_MET: "**not met**"}.get(v, v)
    return (
        f"{num(row[f'{m}_real'])} / {num(row[f'{m}_sim'])}, {percent(row[f'{m}_error'])} "
        f"({percent(row[f'{m}_spread'], False)}) {short}"
    )


def tallies(rows: list[dict[str, Any]]) -> list[str]:
    """One line per target: how many cases met it."""
    closed = [r for r in rows if r["closed_loop"]]
    lines = [
        f"- closed-loop counts identical: {sum(r['counts_equal'] for r in closed)} of "
        f"{len(closed)} cases"
    ]
    for m, (_, target) in METRICS.items():
        got = [r[f"{m}_verdict"] for r in rows if r[f"{m}_verdict"] != "-"]
        lines.append(
            f"- {m} within {target:.0%}: {got.count(MET)} met, {got.count(SPREAD)} within the "
            f"real spread, {got.count(NOT_MET)} not met (of {len(got)})"
        )
    mapes = [r["e2e_mape"] for r in rows if r["e2e_mape"] is not None]
    if mapes:
        lines.append(
            f"- per-request e2e MAPE: median {percent(statistics.median(mapes), False)}, "
            f"max {percent(max(mapes), False)}"
        )
    return lines


def write(
    out: Path,
    rows: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    pairs: list[dict[str, Any]],
    header: dict[str, str],
    alts: dict[str, list[dict[str, Any]]] | None = None,
    twins: list[dict[str, Any]] | None = None,
) -> tuple[Path, ...]:
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "sim_check.csv", out / "sim_check.md", out / "sim_check_steps.csv")
    paths += (out / "sim_check_pairs.csv",)
    write_csv(rows, COLUMNS, paths[0])
    write_csv(steps, STEP_COLUMNS, paths[2])
    write_csv(pairs, PAIR_COLUMNS, paths[3])
    lines = ["# nanoserve simulator check", "", *[f"- {k}: {v}" for k, v in header.items()]]
    lines += ["", "## Targets", "", *tallies(rows)]
    for label, alt in (alts or {}).items():
        lines += ["", f"The same real runs against {label}:", ""]
        lines += tallies(alt)
    lines += ["", *twins_section(twins or [], rows, list(METRICS), NOT_MET)]
    counts = [
        {
            "case": r["case"],
            "closed loop": "yes" if r["closed_loop"] else "no",
            "counts equal": "yes" if r["counts_equal"] else "**no**",
            **{k: counts_cell(r, k) for k in COUNTS},
        }
        for r in rows
    ]
    lines += ["", "## Counts (real / sim where they differ)", ""]
    lines.append(markdown_table(counts, ["case", "closed loop", "counts equal", *COUNTS]))
    lines += [
        "",
        "## Times",
        "",
        "Each cell: real (median of the runs) / simulated, relative error (the real runs' "
        "spread, (max - min) / median), verdict. Seconds; throughput in output tokens/s. "
        "Others' CPU: the largest share of the CPUs other processes took during a kept real "
        "run of the case; canary and prefill: the median slowdowns of the 1-row decode probe "
        "and of the prefill probe around its kept real runs, against the profile's.",
        "",
    ]
    times = [
        {
            "case": r["case"],
            **{m: metric_cell(r, m) for m in METRICS},
            "e2e MAPE": percent(r["e2e_mape"], False),
            "others' CPU": percent(r["others_cpu_max"], False),
            "canary": percent(r["canary_slow"]),
            "prefill": percent(r["prefill_slow"]),
        }
        for r in rows
    ]
    columns = ["case", *METRICS, "e2e MAPE", "others' CPU", "canary", "prefill"]
    lines.append(markdown_table(times, columns))
    lines += [
        "",
        "## Where the seconds go",
        "",
        "Per step kind, the real median run against the simulation: forward seconds (total, "
        "its error, and on a closed loop the mean per-step |error|), sampling, host.",
        "",
    ]
    shown = [
        {
            "case": s["case"],
            "kind": s["kind"],
            "steps": s["steps_real"]
            if s["steps_real"] == s["steps_sim"]
            else f"{s['steps_real']} / {s['steps_sim']}",
            "forward s real / sim": f"{num(s['forward_real_s'])} / {num(s['forward_sim_s'])}",
            "forward error": percent(s["forward_error"]),
            "per-step MAPE": percent(s["forward_step_mape"], False),
            "sample s real / sim": f"{num(s['sample_real_s'])} / {num(s['sample_sim_s'])}",
            "host s real / sim": f"{num(s['host_real_s'])} / {num(s['host_sim_s'])}",
            "host error": percent(s["host_error"]),
        }
        for s in steps
    ]
    lines.append(markdown_table(shown, list(shown[0]) if shown else ["case"]))
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def headline(
    rows: list[dict[str, Any]], twins: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """The parent run's metrics: the tallies, each case's errors, and how far apart the
    twins' real medians lie (the machine's noise in a median, `check_noise.py`)."""
    closed = [r for r in rows if r["closed_loop"]]
    out: dict[str, float] = {
        "cases": len(rows),
        "closed_counts_equal": sum(r["counts_equal"] for r in closed),
        "closed_cases": len(closed),
    }
    for m in METRICS:
        got = [r[f"{m}_verdict"] for r in rows]
        out[f"{m}_met"] = got.count(MET)
        out[f"{m}_within_spread"] = got.count(SPREAD)
        out[f"{m}_not_met"] = got.count(NOT_MET)
        errs = [abs(r[f"{m}_error"]) for r in rows if r[f"{m}_error"] is not None]
        if errs:
            out[f"{m}_abs_error_max"] = max(errs)
        gaps = [t[f"{m}_apart"] for t in twins or [] if t[f"{m}_apart"] is not None]
        if gaps:
            out[f"{m}_twins_apart_max"] = max(gaps)
    out["twin_sets"] = len(twins or [])
    return out


def case_metrics(row: dict[str, Any]) -> dict[str, float]:
    keep = [c for c in COLUMNS if c.endswith(("_real", "_sim", "_error", "_spread"))]
    out = {k: float(row[k]) for k in keep if isinstance(row[k], int | float) and row[k] is not None}
    out["counts_equal"] = float(row["counts_equal"])
    if row["e2e_mape"] is not None:
        out["e2e_mape"] = row["e2e_mape"]
    return out


def log_check(
    cfg: DictConfig,
    args: argparse.Namespace,
    files: Sequence[Path],
    rows: list[dict[str, Any]],
    header: dict[str, str],
    twins: list[dict[str, Any]],
) -> None:
    """One parent run (`nanoserve.kind=sim_check`) with the tables, and a child per case with
    its numbers."""
    kind = "sim_check"
    children = [
        ChildRun(
            name=row["case"],
            tags={"nanoserve.kind": f"{kind}_case", "sim_check.case": row["case"]},
            params={c: str(row[c]) for c in ("workload", "scheduler", "allocator", "output")}
            | {f"verdict.{m}": row[f"{m}_verdict"] for m in METRICS},
            metrics=case_metrics(row),
        )
        for row in rows
    ]
    log_run(
        cfg,
        args,
        files,
        headline(rows, twins),
        tool=kind,
        params={f"{kind}.{re.sub(r'[^A-Za-z0-9_.-]+', '_', k)}": v for k, v in header.items()},
        children=children,
    )
