"""The classic studies' comparison tables: `python run.py +experiment=NAME`.

Each experiment config (`conf/experiment/NAME.yaml`) is a Hydra multirun: its sweeper
params list the policy combinations, and it adds `StudyReport` to `hydra.callbacks`. When
the last job has finished, `StudyReport` reads every job's folder, checks that the runs it
compares did the same work, and writes `NAME.md`, `NAME.csv` and `NAME.png` at the top of
the sweep folder (the sweep's MLflow parent run uploads them), as the sweep's own table is
written (`framework.tracking.sweep_table.write_table`). A finished sweep's table can be
written again with `python -m experiments.studies NAME multirun/NAME/DATE`.

A comparison refuses to compare different work: runs in one comparison group (same
workload) must have produced the same tokens for the same requests (`outputs.jsonl`);
otherwise `DifferentWork` names the runs and the first request that differs, and nothing
is written. The one exception is the project's tie rule (`framework.run.greedy_check`): where
two runs of a real model first differ at a genuine fp32 tie (the two tokens' logits closer
than `TIE`, so a different batch shape or chunking may flip the argmax), the difference is
accepted and listed under the table.
"""

from __future__ import annotations

import argparse
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from framework.run.errors import UserError
from framework.studies.classic import STUDIES, Study
from framework.studies.sweep_runs import (
    DifferentWork,
    ModelTies,
    RunRecord,
    check_same_work,
    load_sweep,
)
from framework.tracking.plots import plot_bars
from framework.tracking.sweep_table import write_table
from framework.tracking.tags import environment_tags


# ---- the report (the format: framework/tracking/tables.py) --------------------------------
def build_rows(
    study: Study, runs: list[RunRecord], params: dict[str, Any], ties: list[str] | None = None
) -> list[dict]:
    """One row per run, its labels then its columns, once the runs of each group are known
    to have done the same work (genuine ties accepted, and listed in `ties`)."""
    got = check_same_work(runs, study.group, ModelTies())
    if ties is not None:
        ties.extend(got)
    return [{name: fn(run, params) for name, fn in study.labels + study.columns} for run in runs]


def heading(runs: list[RunRecord]) -> str:
    """Where the seconds come from: this machine, measured, or a profile's predictions."""
    tags = environment_tags()
    cfg = runs[0].config
    dirty = " with local changes" if tags["git.dirty"] == "true" else ""
    m = runs[0].metrics
    profile = Path(str(m.get("profile", "?"))).name
    if m.get("executor") == "simulated":  # the seconds are predictions, not measurements
        return (
            f"Simulated {time.strftime('%Y-%m-%d')} (executor=simulated, virtual clock, "
            f"{m.get('cost_model', '?')} profile {profile}; computed on "
            f"{tags['machine.cpu']}), model {cfg.model.source}, {cfg.dtype}, commit "
            f"{tags['git.commit'][:10]}{dirty}. Counts hold on any machine; the seconds are "
            f"the profile's predictions for the machine it describes."
        )
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {tags['machine.cpu']} "
        f"({tags['machine.cores']} cores, GPU: {tags['machine.gpu']}), model {cfg.model.source}, "
        f"device {cfg.device}, {cfg.dtype}, threads {cfg.threads or 'default'}, commit "
        f"{tags['git.commit'][:10]}{dirty}. Counts hold on any machine; seconds describe "
        f"only this one."
    )


def write_report(name: str, runs: list[RunRecord], params: dict[str, Any], out: Path) -> Path:
    """`NAME.md`, `NAME.csv` and `NAME.png` in `out`; returns the Markdown file."""
    study = STUDIES[name]
    params = {**study.defaults, **params}
    ties: list[str] = []
    rows = build_rows(study, runs, params, ties)
    note = study.note.format(**params)
    if ties:
        note += "\n\nTies accepted (greedy outputs that first differ at a genuine fp32 tie):\n"
        note += "".join(f"\n- {t}" for t in ties)
    md = write_table(out, name, rows, list(rows[0]), study.title, note, heading(runs))
    for r in rows:
        r["run"] = " / ".join(str(r[label]) for label, _ in study.labels)
    plot_bars(rows, "run", study.plot, out / f"{name}.png", study.title)
    return md


class SweepStudy(Callback, ABC):
    """A study of a sweep's jobs, written when the sweep is done (`hydra.callbacks.study`):
    `write` makes `NAME.md`, `NAME.csv` and `NAME.png` in the sweep folder. Extra fields of
    the callback's config are the study's parameters (an SLO, say)."""

    def __init__(self, name: str, **params: Any) -> None:
        self.name = name
        self.params = params

    @abstractmethod
    def write(self, sweep_dir: Path, params: dict[str, Any]) -> Path:
        """The study's files in `sweep_dir`; the Markdown file's path."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra reports a callback's exception as a mere warning; a refusal must fail the
        command, so it leaves as SystemExit, with its reason also written down in the sweep
        folder (`NAME.refused.txt`, uploaded to the sweep's MLflow run)."""
        sweep_dir = Path(config.hydra.sweep.dir)
        params = OmegaConf.to_container(OmegaConf.create(self.params), resolve=True)
        try:
            md = self.write(sweep_dir, params)  # type: ignore[arg-type]
        except (DifferentWork, FileNotFoundError, UserError) as exc:
            (sweep_dir / f"{self.name}.refused.txt").write_text(f"{exc}\n")
            raise SystemExit(f"study {self.name}: {exc}") from exc
        print(md.read_text(), flush=True)
        print(f"study {self.name}: {md}, .csv and .png", flush=True)


class StudyReport(SweepStudy):
    """Hydra callback (`hydra.callbacks.study`): a classic study's table (`STUDIES`) once
    the sweep is done."""

    def __init__(self, name: str, **params: Any) -> None:
        if name not in STUDIES:
            raise ValueError(f"unknown study {name!r}; studies: {', '.join(STUDIES)}")
        super().__init__(name, **params)

    def write(self, sweep_dir: Path, params: dict[str, Any]) -> Path:
        return write_report(self.name, load_sweep(sweep_dir), params, sweep_dir)


def main(argv: list[str] | None = None) -> Path:
    """Write a finished sweep's table again: `python -m experiments.studies NAME SWEEP_DIR`."""
    ap = argparse.ArgumentParser(
        description="A finished sweep's study table, written again into its folder."
    )
    ap.add_argument("name", choices=list(STUDIES), help="the study (conf/experiment/NAME.yaml)")
    ap.add_argument("sweep_dir", type=Path, help="the sweep's folder (multirun/NAME/DATE)")
    args = ap.parse_args(argv)
    md = write_report(args.name, load_sweep(args.sweep_dir), {}, args.sweep_dir)
    print(md.read_text())
    return md
