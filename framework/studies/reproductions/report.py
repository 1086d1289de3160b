"""A reproduction's report, the same four things for every paper, into its `--out` folder:

- `reproduction.md`: the paper's cells (published, simulated, deviation), the set-up, every
  assumption with its source, the reproduction's own sections, and every run it made;
- `reproduction.json`: the same as numbers: `name`, `paper`, `figure`, `quick`,
  `overrides`, `command`, `cells` (each `name`, `published`, `published_high`, `simulated`,
  `unit`, `deviation`, `deviation_kind`, `relative`, `source`, `note`), `assumptions`,
  `setup`, `jobs` (each run's overrides, wall seconds and metrics), `data` (the figure's
  series), `tags` (commit, machine);
- `reproduction.png`: the paper's figure with the published points overlaid;
- one MLflow run (`nanoserve.kind=reproduction`, named after the reproduction): the composed
  config and the command's arguments as params, each cell's simulated value and deviation as
  metrics, the three files as artifacts.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from framework.studies.reproductions.cells import POINTS, Cell
from framework.studies.reproductions.registry import Entry
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.tracking.tables import markdown_table
from framework.tracking.tags import environment_tags
from framework.tracking.tool_run import log_run

FILES = ("reproduction.md", "reproduction.json", "reproduction.png")
# The numbers of a run that the runs table shows, where a run has them.
RUN_COLUMNS = ("requests", "requests_rejected", "steps", "mean_rows", "prefix_hit_rate")


def number(value: float | None, unit: str) -> str:
    """A cell's value as the paper prints it: `37.34%`, `2.6x`, `1.6 req/s`."""
    if value is None:
        return "-"
    if unit == POINTS:
        return f"{value:.2f}%"
    if unit == "x":
        return f"{value:.3g}x"
    return f"{value:.4g} {unit}".rstrip()


def deviation_text(cell: Cell) -> str:
    d = cell.deviation
    if d is None:
        return "-"
    if cell.deviation_kind == "points":
        return f"{d:+.2f} points"
    return f"{100 * d:+.1f}%"


def cells_table(cells: list[Cell]) -> str:
    rows = [
        {
            "cell": c.name,
            "published": c.published_text(),
            "simulated": number(c.simulated, c.unit),
            "deviation": deviation_text(c),
            "published in": c.source,
        }
        for c in cells
    ]
    return markdown_table(rows, ["cell", "published", "simulated", "deviation", "published in"])


def runs_table(ctx: Context) -> str:
    rows = []
    for job in ctx.jobs:
        row: dict[str, Any] = {"run": job.name, "wall s": round(job.wall_s, 1)}
        row |= {k: job.metrics.get(k) for k in RUN_COLUMNS}
        row["overrides"] = " ".join(job.overrides) or "-"
        rows.append(row)
    return markdown_table(rows, ["run", "wall s", *RUN_COLUMNS, "overrides"])


def markdown(entry: Entry, ctx: Context, outcome: Outcome, command: str, tags: dict) -> str:
    dirty = " with local changes" if tags["git.dirty"] == "true" else ""
    quick = (
        [
            "**Quick form** (`--quick`): a smaller run for the tests; its numbers are not the "
            "reproduction's.",
            "",
        ]
        if ctx.quick
        else []
    )
    lines = [
        f"# {entry.name}: {entry.paper}, {entry.figure}",
        "",
        f"`{command}`",
        "",
        *quick,
        cells_table(outcome.cells),
        "",
        "Deviation: a percentage's in points (simulated - published), any other unit's as "
        "simulated / published - 1; a published range counts as met anywhere inside it. "
        f"Computed on {tags['machine.cpu']}, commit {tags['git.commit'][:10]}{dirty}; the "
        "runs' seconds are simulated (the profile's), the wall seconds this machine's.",
        "",
        "![figure](reproduction.png)",
        "",
        "## Set-up",
        "",
        outcome.setup.strip(),
        "",
        "## Assumptions",
        "",
        *[f"- {a.text} ({a.source})" for a in outcome.assumptions],
        "",
    ]
    for heading, body in outcome.sections:
        lines += [f"## {heading}", "", body.strip(), ""]
    lines += ["## Runs", "", runs_table(ctx), ""]
    if ctx.overrides:
        lines += [f"Every run with the overrides `{' '.join(ctx.overrides)}`.", ""]
    return "\n".join(lines)


def write(
    entry: Entry, ctx: Context, outcome: Outcome, command: str, args: argparse.Namespace
) -> list[Path]:
    """The report's files into `ctx.out`, and its MLflow run; returns the files."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    tags = environment_tags()
    md, js, png = (ctx.out / name for name in FILES)
    outcome.draw(png)
    md.write_text(markdown(entry, ctx, outcome, command, tags))
    data = {
        "name": entry.name,
        "paper": entry.paper,
        "figure": entry.figure,
        "quick": ctx.quick,
        "overrides": ctx.overrides,
        "command": command,
        "cells": [c.to_json() for c in outcome.cells],
        "assumptions": [a.to_json() for a in outcome.assumptions],
        "setup": outcome.setup.strip(),
        "jobs": [j.to_json() for j in ctx.jobs],
        "data": outcome.data,
        "tags": {k: tags[k] for k in ("git.commit", "git.dirty", "machine.cpu", "machine.cores")},
    }
    js.write_text(json.dumps(data, indent=2) + "\n")
    files = [md, js, png]
    log_run(
        outcome.config,
        args,
        files,
        cell_metrics(outcome.cells),
        tool="reproduce",
        kind="reproduction",
        name=entry.name,
        tags={"reproduction.name": entry.name, "reproduction.quick": str(ctx.quick).lower()},
        params={"reproduction.paper": entry.paper, "reproduction.figure": entry.figure},
    )
    return files


def cell_metrics(cells: list[Cell]) -> dict[str, float]:
    """Each cell's simulated value and deviation, under a name MLflow accepts."""
    metrics: dict[str, float] = {}
    for i, c in enumerate(cells):
        slug = f"{i:02d}_" + re.sub(r"[^0-9a-zA-Z]+", "_", c.name).strip("_").lower()
        if c.simulated is not None:
            metrics[f"{slug}.simulated"] = c.simulated
        if c.deviation is not None:
            metrics[f"{slug}.deviation"] = c.deviation
    return metrics
