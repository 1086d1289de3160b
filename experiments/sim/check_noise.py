"""The machine's noise measured in the simulator check itself, from its twins: the cases
that took the same steps.

Two policies can serve a closed-loop workload with the same schedule: static batching with
worst-case or with incremental allocation, while the pool never runs dry; continuous,
priority and sjf on a preset whose requests all wait from the start with one priority.
Their simulations price the same steps; their real runs are the same work, measured at
other moments of the check. How far apart the twins' real medians lie is therefore what the
machine's own noise does to a median of `--rounds` runs, measured inside the check. Half of
it is a floor under any simulator's largest error among the twins on that machine, and the
whole is the figure to read a verdict beside. On a quiet machine the twins agree, and a
simulator's error stands out from them.

The twins are found, not listed: cases of one workload under one output policy whose
simulated steps carry the same features, step for step, and whose real runs counted what
the simulation did.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from experiments.toolkit.report import percent
from framework.tracking.tables import markdown_table


def groups(runs: Sequence[Any], rows: Sequence[dict[str, Any]]) -> list[list[int]]:
    """The indexes (into `runs` and `rows`, one row per run) of every set of two or more
    closed-loop cases with equal counts that took the same steps, in the check's order."""
    found: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, (r, row) in enumerate(zip(runs, rows, strict=True)):
        if r.case.closed and row["counts_equal"] and r.features:
            output = r.case.combo[2], r.case.extra
            found[(r.case.workload, output, tuple(r.features))].append(i)
    return [members for members in found.values() if len(members) > 1]


def apart(values: Sequence[float | None]) -> float | None:
    """(max - min) / median of the twins' real medians: the real runs' spread, one level up."""
    seen = [v for v in values if v is not None]
    if len(seen) < 2:
        return None
    mid = statistics.median(seen)
    return (max(seen) - min(seen)) / mid if mid else None


def twin_rows(
    runs: Sequence[Any], rows: Sequence[dict[str, Any]], metrics: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per twin set: its cases, their steps, and per metric how far apart the real
    medians lie (`{m}_apart`) and the largest |error| of the simulation among them
    (`{m}_error_max`)."""
    out = []
    for members in groups(runs, rows):
        row: dict[str, Any] = {
            "cases": [rows[i]["case"] for i in members],
            "steps": len(runs[members[0]].features),
        }
        for m in metrics:
            row[f"{m}_apart"] = apart([rows[i][f"{m}_real"] for i in members])
            errors = [
                abs(rows[i][f"{m}_error"]) for i in members if rows[i][f"{m}_error"] is not None
            ]
            row[f"{m}_error_max"] = max(errors) if errors else None
        out.append(row)
    return out


def misses_inside(
    twins: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    metrics: Sequence[str],
    not_met: str,
) -> tuple[int, int]:
    """(cells whose verdict is `not_met` and whose |error| is within their twins' distance
    apart, cells whose verdict is `not_met`)."""
    apart_of = {(c, m): t[f"{m}_apart"] for t in twins for c in t["cases"] for m in metrics}
    missed = [(r, m) for r in rows for m in metrics if r[f"{m}_verdict"] == not_met]
    inside = sum(
        1
        for r, m in missed
        if (d := apart_of.get((r["case"], m))) is not None and abs(r[f"{m}_error"]) <= d
    )
    return inside, len(missed)


def unsigned(v: float | None) -> str:
    return percent(v, signed=False)


def section(
    twins: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    metrics: Sequence[str],
    not_met: str,
) -> list[str]:
    """The report's lines on the twins: what they are, one table, and the misses they explain."""
    lines = [
        "## Twins: cases that took the same steps",
        "",
        "Closed-loop cases of one workload and output policy whose simulations priced the same "
        "steps, feature for feature: one piece of work, measured at other moments. Each cell: how "
        "far apart their real medians lie ((max - min) / median), then the largest |error| of the "
        "simulation among them. The first figure is the machine's noise in a median, measured "
        "here: no simulation can come closer to every twin than half of it.",
        "",
    ]
    if not twins:
        return [*lines, "No two cases took the same steps in this check."]
    shown = [
        {
            "cases": ", ".join(t["cases"]),
            "steps": t["steps"],
            **{
                m: f"{unsigned(t[f'{m}_apart'])} ({unsigned(t[f'{m}_error_max'])})" for m in metrics
            },
        }
        for t in twins
    ]
    lines.append(markdown_table(shown, ["cases", "steps", *metrics]))
    inside, missed = misses_inside(twins, rows, metrics, not_met)
    widest = max((t["makespan_apart"] or 0.0) for t in twins) if "makespan" in metrics else None
    lines += ["", f"- cells not met within their twins' distance apart: {inside} of {missed}"]
    if widest is not None:
        lines.append(f"- twins' real makespans apart: up to {unsigned(widest)}")
    return lines
