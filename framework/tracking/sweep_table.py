"""Hydra callback: a sweep read at a glance. When a multirun ends, one comparison table of
its jobs (what each varied, then the key counts and times), on the console and as `sweep.md`
and `sweep.csv` at the top of the sweep folder, then where the results are.

The table is built from what the jobs left in their folders (`.hydra/overrides.yaml`,
`metrics.json`), so it is the same whichever launcher ran them (in this process, joblib
workers, SLURM). A job that stopped early (`"incomplete": true`) or left no `metrics.json`
is a row that says so. When a job fails Hydra ends the process before `on_multirun_end`,
so the table is then written at exit: that is when one wants to see which jobs failed.

Listed after `tracking` in `hydra.callbacks`: Hydra runs end hooks in reverse order, so the
files are written before the sweep's MLflow parent run uploads the top of the folder, and the
parent run's line comes last. A study (`+experiment=NAME`) prints its own table, written by
the same `write_table` (framework/studies); this one is then only written, not printed
(unless the study wrote none, having refused to compare).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from framework.tracking.sweep_exit import at_early_end, done
from framework.tracking.tables import cell, job_folders, markdown_table, write_csv
from framework.tracking.tags import SweepPlan, override_key, sweep_plan

NAME = "sweep"  # sweep.md, sweep.csv
# Counts hold on any machine; times describe only the one that ran the job. The keys are
# those of metrics.json (framework/run/summary.py).
KEY_COUNTS = (
    "requests_finished",
    "steps",
    "token_slots",
    "waste_fraction",
    "occupancy",
    "preemptions",
)
KEY_TIMES = ("makespan_s", "output_tokens_per_s", "ttft_p50_s", "tpot_p50_s")
METRIC_COLUMNS = KEY_COUNTS + KEY_TIMES
NOTE = "Counts hold on any machine; the seconds describe only the machine that ran the jobs."


def read_plan(sweep_dir: str | Path | None) -> SweepPlan | None:
    """The plan of the sweep a job belongs to, from the `multirun.yaml` Hydra's basic sweeper
    saves at the top of the sweep folder before it launches a job: a job cannot see the
    command line's sweep itself, but any process that can read the folder can read this."""
    if sweep_dir is None:
        return None
    try:
        cfg = OmegaConf.load(Path(sweep_dir) / "multirun.yaml")
        return sweep_plan(cfg.hydra.overrides.task, cfg.hydra.sweeper)
    except Exception:  # no such file (another sweeper), or one this code cannot read
        return None


def _status(metrics: dict[str, Any] | None) -> str:
    if metrics is None:
        return "failed: no metrics.json"
    if metrics.get("incomplete"):
        error = str(metrics.get("error") or "unknown error").splitlines()[0]
        return f"incomplete: {error[:120]}"
    return "ok"


def job_row(folder: Path, swept: Sequence[str]) -> dict[str, Any]:
    """One job: its folder name, its value of each swept key (or all its overrides when
    nothing is known to be swept), the key metrics and whether it finished."""
    try:
        overrides = [str(o) for o in OmegaConf.load(folder / ".hydra" / "overrides.yaml")]
    except Exception:
        overrides = []
    row: dict[str, Any] = {"job": folder.name}
    if swept:
        values = {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
        row.update({key: values.get(key) for key in swept})
    else:
        row["overrides"] = " ".join(overrides)
    try:
        metrics: dict[str, Any] | None = json.loads((folder / "metrics.json").read_text())
    except (OSError, ValueError):
        metrics = None
    row.update({key: (metrics or {}).get(key) for key in METRIC_COLUMNS})
    row["status"] = _status(metrics)
    return row


def sweep_rows(sweep_dir: Path, swept: Sequence[str]) -> list[dict[str, Any]]:
    """The comparison table of a sweep: one row per job folder, in job order."""
    if not sweep_dir.is_dir():
        return []  # no job got as far as its folder
    return [job_row(folder, swept) for folder in job_folders(sweep_dir)]


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(rows[0]) if rows else ["job", *METRIC_COLUMNS, "status"]


def write_table(
    folder: Path,
    name: str,
    rows: Sequence[dict[str, Any]],
    cols: Sequence[str],
    title: str,
    note: str,
    heading: str = "",
) -> Path:
    """An end-of-sweep table at the top of the sweep folder: `NAME.csv` (raw values) and
    `NAME.md` (the title, a heading, the table, a note). The sweep's own table and every
    study's (`framework.studies`) are written by this one function, so they read alike.
    Returns the Markdown file."""
    write_csv(rows, cols, folder / f"{name}.csv")
    head = f"{heading}\n\n" if heading else ""
    md = folder / f"{name}.md"
    md.write_text(f"## {title}\n\n{head}{markdown_table(rows, cols)}\n\n{note}\n")
    return md


def write_sweep_table(rows: Sequence[dict[str, Any]], sweep_dir: Path, title: str) -> Path:
    """`sweep.md` and `sweep.csv` at the top of the sweep folder; returns the Markdown file."""
    return write_table(sweep_dir, NAME, rows, columns(rows), title, NOTE)


def _rich_table(rows: Sequence[dict[str, Any]], title: str, headers: Sequence[str]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col, header in zip(columns(rows), headers, strict=True):
        # Last resort on a narrow terminal: a cell folds onto a second line, no digit lost.
        table.add_column(
            header, justify="right" if col in METRIC_COLUMNS else "left", overflow="fold"
        )
    for r in rows:
        style = None if r["status"] == "ok" else "red"
        table.add_row(*(cell(r.get(c)) for c in columns(rows)), style=style)
    return table


def print_sweep_table(rows: Sequence[dict[str, Any]], title: str) -> None:
    """The same rows as a rich table. Off a terminal (a log, a pipe) it is drawn at its full
    width, so a job stays one line of the log; on a terminal too narrow for that, the
    headers break after their underscores first."""
    from rich.console import Console

    cols = columns(rows)
    table = _rich_table(rows, title, cols)
    width = Console(width=10_000).measure(table).maximum  # unfolded
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(80, width))
    elif width > console.width:
        table = _rich_table(rows, title, [re.sub(r"_(?!s$)", "_\n", c) for c in cols])
    console.print(table)


class SweepTable(Callback):
    """Hydra callback (`hydra.callbacks.table`): the sweep's comparison table at its end."""

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None
        self.plan: SweepPlan | None = None
        self.study: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = Path(config.hydra.sweep.dir).resolve()
        self.plan = sweep_plan(config.hydra.overrides.task, config.hydra.sweeper)
        study = config.hydra.callbacks.get("study")
        self.study = str(study.name) if study is not None else None
        # A failed job (or a refused study, Ctrl-C) ends the process before on_multirun_end.
        at_early_end(self.report)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        done(self.report)
        self.report()

    def report(self) -> None:
        """Write and print the table, then the folder. Never raises: Hydra would turn it into
        a warning anyway, and at exit it would bury the job's own error."""
        if self.sweep_dir is None or self.plan is None:
            return
        sweep_dir, self.sweep_dir = self.sweep_dir, None  # once, whichever way the sweep ends
        try:
            rows = sweep_rows(sweep_dir, self.plan.swept)
            done = sum(r["status"] == "ok" for r in rows)
            total = max(len(rows), self.plan.jobs or 0)  # Ctrl-C: some never started
            what = " ".join(self.plan.sweeps) or "no swept key"
            title = f"{NAME}: {what} ({done} of {total} jobs finished)"
            if rows:
                write_sweep_table(rows, sweep_dir, title)
                # A study printed its own table; print this one only where it wrote none.
                if self.study is None or not (sweep_dir / f"{self.study}.md").is_file():
                    print_sweep_table(rows, title)
            print(f"sweep folder: {sweep_dir}", flush=True)
        except Exception as exc:
            print(f"sweep table not written: {type(exc).__name__}: {exc}", file=sys.stderr)
