"""A run, a sweep and a capacity search called from Python (a notebook), each returning its
results as data rather than files to read back. Each takes the overrides `python run.py`
takes, composes the same config from `conf/`, and writes the same folder as the command line
(the run folder, the sweep folder, the search's report):

    from framework.studies.notebook import goodput, run, sweep

    r = run(["model=tiny", "scheduler=continuous", "output=deferred", "window=4"])
    r.metrics["tokens_kept"], r.requests["ttft_s"].median(), r.steps["rows"].mean()
    points = sweep(["model=tiny", "observers=[]", "scheduler=static,continuous"])
    found = goodput(["executor=simulated", "model=tiny", "workload=synthetic"], 0.005, 0.001)

A mistake in the overrides raises `UserError` with the line the command line would print.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from framework.run.cli import hydra_user_error, run_command
from framework.run.compose import compose_config, compose_sweep_config
from framework.run.errors import Refused, UserError
from framework.run.observers import run_with_observers
from framework.studies.goodput import OUT, report, write_report
from framework.studies.goodput_probes import search
from framework.tracking.run_files import read_text, run_file
from framework.tracking.sweep_table import job_row, read_plan
from framework.tracking.tables import job_folders


@dataclass
class RunResults:
    """One run's results, as its folder holds them (docs/results.md has every column)."""

    folder: Path  # the run folder, written as `python run.py` writes it
    metrics: dict[str, Any]  # metrics.json
    requests: pd.DataFrame  # requests.csv: one row per request
    steps: pd.DataFrame  # steps.csv: one row per engine step
    outputs: pd.DataFrame  # outputs.jsonl: each request's token ids and text
    config: DictConfig  # config.yaml: the resolved config the run used


@dataclass
class GoodputResults:
    """A capacity search's result: the goodput (None when even the lowest rate probed
    missed), why the search stopped, and every probe."""

    goodput_rps: float | None
    status: str  # converged, budget, above (every probe met), below (none did)
    bracket: tuple[float | None, float | None]  # (highest rate met, lowest rate missed)
    line: str  # the headline, as the command prints it
    warning: str | None  # the run at the goodput may not have kept up with its rate
    probes: pd.DataFrame  # one row per simulated run, in the order made: every metric
    report: dict[str, Any]  # goodput.json
    folder: Path  # where goodput.md, goodput.csv and goodput.json were written


def run(overrides: Sequence[str] = (), out: str | Path | None = None) -> RunResults:
    """Run the config of `overrides` as `python run.py OVERRIDES` runs it, with its
    observers, into `out` (default: the run folder `python run.py` would use,
    `outputs/DATE/TIME/` under the working directory), and return its results."""
    from hydra.types import RunMode

    cfg = compose_config(overrides, hydra=True)
    if cfg.hydra.mode == RunMode.MULTIRUN:
        raise UserError(
            f"{' '.join(overrides)}: this config is a sweep (hydra.mode=MULTIRUN); "
            "call sweep() with these overrides"
        )
    folder = Path(out if out is not None else cfg.hydra.run.dir).absolute()
    job = copy.deepcopy(cfg)
    with open_dict(job):
        del job["hydra"]
    with as_hydra_job(cfg, folder):
        run_with_observers(job, folder)
    return read_run(folder)


def read_run(folder: str | Path) -> RunResults:
    """The results a finished (or stopped) run left in its folder, as `run` returns them."""
    folder = Path(folder)
    outputs = run_file(folder, "outputs.jsonl")
    return RunResults(
        folder=folder,
        metrics=json.loads((folder / "metrics.json").read_text()),
        requests=read_csv(folder / "requests.csv"),
        steps=read_csv(run_file(folder, "steps.csv")),
        outputs=read_jsonl(outputs),
        config=OmegaConf.load(folder / "config.yaml"),  # type: ignore[arg-type]
    )


def sweep(overrides: Sequence[str], out: str | Path | None = None) -> pd.DataFrame:
    """Run the sweep of `overrides` as `python run.py -m OVERRIDES` runs it (its callbacks
    too: the sweep's table, a study's, the MLflow parent run) into `out` (default: the sweep
    folder that command would use) and return one row per job: its folder name, its value of
    each swept key, the columns of `sweep.csv` and then every other scalar of its
    metrics.json. `df.attrs["folder"]` is the sweep folder."""
    folder = Path(out if out is not None else compose_sweep_config(overrides).hydra.sweep.dir)
    folder = folder.absolute()
    try:
        run_command(["-m", *overrides, f"hydra.sweep.dir={folder}"])
    except Refused as refused:
        raise UserError(str(refused)) from refused
    except UserError:
        raise
    except Exception as error:
        message = hydra_user_error(error)
        if message is None:
            raise
        raise UserError(message) from error
    return sweep_frame(folder)


def sweep_frame(folder: str | Path) -> pd.DataFrame:
    """A finished sweep's jobs as `sweep` returns them."""
    folder = Path(folder)
    plan = read_plan(folder)
    swept = plan.swept if plan is not None else ()
    rows = []
    for job in job_folders(folder):
        row = job_row(job, swept)
        metrics_file = job / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
        row.update({k: v for k, v in metrics.items() if k not in row and _scalar(v)})
        rows.append(row)
    frame = pd.DataFrame(rows)
    for key in swept:  # `engine.max_num_seqs=4,8`: numbers, not the override's text
        with contextlib.suppress(ValueError, TypeError):
            frame[key] = pd.to_numeric(frame[key])
    frame.attrs["folder"] = folder
    return frame


def goodput(
    overrides: Sequence[str],
    ttft_s: float,
    tpot_s: float,
    *,
    attainment: float = 0.9,
    low: float | None = None,
    high: float | None = None,
    tolerance: float = 0.05,
    growth: float = 2.0,
    max_probes: int = 20,
    out: str | Path | None = None,
) -> GoodputResults:
    """Search the config of `overrides` (`executor=simulated`, a workload with a request
    rate) for its goodput, as `python -m experiments.goodput --ttft TTFT_S --tpot TPOT_S
    OVERRIDES` does: the highest `workload.rate` at which `attainment` of all requests meet
    both targets. The report goes to `out` (default `outputs/goodput`, the command's)."""
    result, prober, cfg = search(
        overrides,
        ttft_s,
        tpot_s,
        attainment=attainment,
        low=low,
        high=high,
        tolerance=tolerance,
        growth=growth,
        max_probes=max_probes,
    )
    asked = f"goodput({list(overrides)!r}, ttft_s={ttft_s!r}, tpot_s={tpot_s!r})"
    data = report(prober, result, cfg, tolerance, asked)
    folder = Path(out) if out is not None else OUT
    write_report(folder, data)
    return GoodputResults(
        goodput_rps=result.goodput,
        status=result.status,
        bracket=(result.low, result.high),
        line=data["line"],
        warning=data["warning"],
        probes=pd.DataFrame(prober.rows),
        report=data,
        folder=folder,
    )


@contextlib.contextmanager
def as_hydra_job(cfg: DictConfig, folder: Path) -> Iterator[None]:
    """Hydra's view of the current job set as `python run.py` sets it (what the observers
    read of it: the run's overrides and choices, that it is no sweep's job), and the
    process's earlier view given back after."""
    from hydra.core.hydra_config import HydraConfig

    state = HydraConfig.instance()
    before = state.cfg
    hydra = copy.deepcopy(cfg)
    with open_dict(hydra):
        hydra.hydra.runtime.output_dir = str(folder)
    state.set_config(hydra)
    try:
        yield
    finally:
        state.cfg = before


def read_csv(path: Path) -> pd.DataFrame:
    """A run's CSV file as a DataFrame; an empty file (a run without steps) as an empty one."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def read_jsonl(path: Path) -> pd.DataFrame:
    """outputs.jsonl (gzipped or not) as a DataFrame, a row a line; none for no lines."""
    lines = read_text(path).splitlines()
    return pd.DataFrame([json.loads(line) for line in lines if line.strip()])


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)
