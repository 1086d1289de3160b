"""Every run is an MLflow run: params, metrics, per-step series, artifacts and tags; a
multirun is one parent run with a named child per job; a store that is down or fails half
way never costs a run its results; the plots and the launcher configs.

All runs log to a SQLite file in a temporary folder (never `mlflow.db` in the repo); one
file per module, since creating one costs seconds of schema migrations.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import gc
import json
import os
import shutil
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from importlib import metadata
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient
from omegaconf import OmegaConf

from framework.api.hookspecs import hookimpl
from framework.core.step_stats import STEP_COLUMNS
from framework.plugin_host.registry import registry
from framework.run import steps_csv
from framework.run.observers import run_with_observers
from framework.run.steps_csv import write_steps
from framework.run.summary import COUNT_KEYS
from framework.studies.sweep_runs import load_run
from framework.tracking import background as background_module
from framework.tracking import plots as plots_module
from framework.tracking import replica_plots as replica_plots_module
from framework.tracking.background import ORPHANED, BackgroundRun
from framework.tracking.figures import plt
from framework.tracking.figures import save_figure as real_save_figure
from framework.tracking.machine import cpu_model
from framework.tracking.plots import (
    PLOTS,
    STEP_PLOT_COLUMNS,
    assign_lanes,
    envelope,
    read_csv,
    read_step_columns,
    request_spans,
    save_run_plots,
    step_columns,
)
from framework.tracking.run_files import run_file
from framework.tracking.tags import flatten, sweep_plan
from plugins.observers.mlflow_logger import MlflowLogger
from tests.helpers import ROOT, make_cfg

STRAGGLER = ["model=tiny", "workload=straggler", "scheduler=static", "engine.max_num_seqs=4"]
# Twelve requests, eight rows, sixteen blocks: incremental allocation must preempt.
TIGHT = [
    "model=tiny",
    "workload=fixed",
    "workload.prompt_lens=[24,24,24,24,24,24]",
    "workload.output_lens=[40,8,32,16,40,24]",
    "engine.max_num_seqs=6",
    "engine.num_blocks=10",
    "engine.block_size=16",
]


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def tracked(store_uri: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    return store_uri


@pytest.fixture
def loaded(tiny: tuple[Any, Any]) -> tuple[Any, ...]:
    model, tok = tiny
    return model, tok, torch.device("cpu"), torch.float32


@pytest.fixture(scope="module")
def tight_run(tiny: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One run of TIGHT without observers, `(folder, info)`, shared by the tests that only
    read its files and steps (each copies the folder before writing beside them): the same
    run each would make for itself."""
    folder = tmp_path_factory.mktemp("tight")
    model, tok = tiny
    loaded = (model, tok, torch.device("cpu"), torch.float32)
    return folder, run_with_observers(make_cfg(*TIGHT, "observers=[]"), folder, loaded)


def copy_of(run: tuple[Path, Any], where: Path) -> Path:
    """The shared run's files in a folder of the test's own."""
    shutil.copytree(run[0], where, dirs_exist_ok=True)
    return where


def runs_of(uri: str, experiment: str) -> list[Any]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} in {uri}"
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def test_a_long_runs_files_are_gzipped_and_the_artifacts_capped(
    tracked: str, loaded: tuple[Any, ...], tmp_path: Path, figures: dict[str, Any]
) -> None:
    """`results.compress=true` writes steps.csv.gz and outputs.jsonl.gz, which the plots and
    the studies read back; `mlflow.max_artifact_mb` uploads the smallest files that fit and
    names the rest, with the folder they stay in."""
    cap_mb = 0.03
    cfg = make_cfg(
        *TIGHT,
        "results.compress=true",
        f"mlflow.max_artifact_mb={cap_mb}",
        "mlflow.experiment=capped",
        "mlflow.background=false",
        "observers=[plots,mlflow]",
    )
    run_with_observers(cfg, tmp_path, loaded)
    assert not (tmp_path / "steps.csv").exists() and not (tmp_path / "outputs.jsonl").exists()
    assert_plots_show_the_run(tmp_path, figures)  # drawn from the .gz
    record = load_run(tmp_path)
    assert len(record.outputs) == 6 and len(record.steps) == record.metrics["steps"]
    (run,) = runs_of(tracked, "capped")
    uploaded = artifacts(tracked, run.info.run_id)
    on_disk = {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.is_file()}
    assert {"metrics.json", "config.yaml", "requests.csv"} <= uploaded  # the smallest
    room = cap_mb * 2**20 - sum(on_disk[n] for n in uploaded if n in on_disk)
    assert room >= 0
    left = set(on_disk) - uploaded
    assert left, "the cap leaves nothing out: make it smaller"
    assert all(on_disk[n] > room for n in left)  # smallest first: none left out that fits
    tag = run.data.tags["nanoserve.artifacts_left_out"]
    assert all(name in tag for name in left) and str(tmp_path.resolve()) in tag


def artifacts(uri: str, run_id: str) -> set[str]:
    return {a.path for a in MlflowClient(uri).list_artifacts(run_id)}


# ---- what a picture shows ------------------------------------------------------------------
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height in pixels, from its header (which must be a PNG's)."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def assert_a_png_of(fig: Any, path: Path) -> None:
    """`path` is the PNG of `fig`: its size at the 100 dpi `save_figure` draws at, and more
    than a blank canvas (a figure whose curves went missing is a few flat colours)."""
    want = tuple(round(v * 100) for v in fig.get_size_inches())
    assert png_size(path) == want, path
    pixels = plt.imread(path)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 16, path


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every figure the pictures of a run save, by file name: what each was drawn from."""
    drawn: dict[str, Any] = {}

    def keep(fig: Any, path: Path) -> Path:
        drawn[Path(path).name] = fig
        return real_save_figure(fig, path)

    monkeypatch.setattr(plots_module, "save_figure", keep)
    monkeypatch.setattr(replica_plots_module, "save_figure", keep)
    return drawn


def drawn_bars(ax: Any) -> list[tuple[int, int, int, bool]]:
    """The slot timeline's bars as (lane, first step, last step, wasted)."""
    bars = []
    for bar in ax.collections:  # one `broken_barh` a span
        (path,) = bar.get_paths()
        x, y = path.vertices[:, 0], path.vertices[:, 1]
        start, end = round(x.min()), round(x.max()) - 1
        bars.append((int(y.min()), start, end, bar.get_hatch() == "///"))
    return bars


def assert_plots_show_the_run(run_dir: Path, drawn: dict[str, Any]) -> None:
    """The three pictures are PNGs of their figures, and each figure shows what the run's
    files hold: the slot timeline fills as many slots each step as the engine ran rows (the
    grey ones its wasted rows) and marks each preemption; the KV picture's curves are
    steps.csv's blocks in use and waiting queue, with a marker at each step that preempted;
    the latency CDFs step through requests.csv's TTFTs and end-to-end times."""
    assert sorted(drawn) == sorted(PLOTS)
    for name in PLOTS:
        assert_a_png_of(drawn[name], run_dir / name)
    steps_path = run_file(run_dir, "steps.csv")
    steps = read_step_columns(steps_path, (*STEP_PLOT_COLUMNS, "wasted_rows"))
    requests = read_csv(run_file(run_dir, "requests.csv"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    slots = int(OmegaConf.load(run_dir / "config.yaml").engine.max_num_seqs)
    n = len(steps["step"])
    assert n == metrics["steps"] > 0 and steps["preempted"].sum() == metrics["preemptions"]

    (timeline,) = drawn["slot_timeline.png"].axes
    assert timeline.get_title() == f"slot timeline: {slots} slots x {n} steps"
    bars = drawn_bars(timeline)
    busy, wasted = Counter(), Counter()
    for lane, start, end, grey in bars:
        assert 0 <= lane < slots and 0 <= start <= end < n
        (wasted if grey else busy).update(range(start, end + 1))
    for lane in range(slots):  # a slot holds one row at a time
        taken = sorted((s, e) for la, s, e, _ in bars if la == lane)
        assert all(e < s2 for (_, e), (s2, _) in pairwise(taken)), lane
    assert [busy[i] + wasted[i] for i in range(n)] == steps["rows"].tolist()
    assert [wasted[i] for i in range(n)] == steps["wasted_rows"].tolist()
    crosses = [line for line in timeline.get_lines() if line.get_marker() == "x"]
    assert len(crosses) == metrics["preemptions"]

    kv, queue = drawn["kv_blocks.png"].axes
    lines = {line.get_label(): line for line in kv.get_lines()}
    used = lines["blocks in use"]
    assert used.get_xdata().tolist() == steps["step"].tolist()
    assert used.get_ydata().tolist() == steps["blocks_in_use"].tolist()
    (waiting,) = queue.get_lines()
    assert waiting.get_ydata().tolist() == steps["waiting"].tolist()
    preempting = steps["step"][steps["preempted"] > 0].tolist()
    marks = list(lines["preemption"].get_xdata()) if "preemption" in lines else []
    assert marks == preempting
    peak, pool = int(steps["blocks_in_use"].max()), metrics["num_blocks"]
    assert kv.get_title().startswith(f"KV blocks in use: peak {peak} (pool {pool} blocks")
    assert kv.get_title().endswith(f"; {metrics['preemptions']} preemptions")
    if pool <= 2 * peak:
        assert list(lines[f"pool {pool} blocks"].get_ydata()) == [pool, pool]
    else:
        assert "off the scale" in kv.get_title()

    (cdf,) = drawn["latency_cdf.png"].axes
    curves = {line.get_label().split(" (p50")[0]: line for line in cdf.get_lines()}
    assert set(curves) == {"time to first token", "end to end"}
    for label, column in (("time to first token", "ttft_s"), ("end to end", "e2e_s")):
        values = sorted(float(r[column]) for r in requests if r[column])
        assert len(values) == metrics["requests_finished"]
        assert curves[label].get_xdata()[1:].tolist() == values
        frac = curves[label].get_ydata().tolist()
        assert frac[0] == 0.0 and frac[-1] == 1.0 and frac == sorted(frac)


# ---- pieces --------------------------------------------------------------------------------
def test_flatten_keeps_every_leaf_and_lists_whole() -> None:
    cfg = OmegaConf.to_container(make_cfg(*STRAGGLER), resolve=True)
    flat = flatten(cfg, skip=["mlflow"])
    assert flat["scheduler.name"] == "static" and flat["engine.max_num_seqs"] == "4"
    assert flat["workload.output_lens"] == "[4, 4, 4, 4, 4, 4, 4, 32]"
    assert flat["model.tiny.num_hidden_layers"] == "2" and flat["dtype"] == "float32"
    assert flat["seed"] == "0" and flat["workload.seed"] == "0"
    assert not any(k.startswith("mlflow.") for k in flat)


class Key(enum.Enum):
    max_tokens = "max_tokens"


def test_params_name_a_plugins_enum_field() -> None:
    """A plugin's config may hold an Enum (the example plugin's `scheduler.key`)."""
    cfg = OmegaConf.create({"scheduler": {"name": "aged_sjf", "key": Key.max_tokens}})
    params = MlflowLogger._params(SimpleNamespace(config=cfg), None)
    assert params["scheduler.key"] == "max_tokens"


def test_sweep_plan_expands_like_the_basic_sweeper() -> None:
    sweeper = {
        "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
        "params": {"window": "0,1,2"},
    }
    plan = sweep_plan(["scheduler=static,continuous", "allocator=worst_case", "window=4"], sweeper)
    assert plan.jobs == 2 and plan.swept == ("scheduler",)  # window=4 overrides the params
    plan = sweep_plan(["scheduler=static,continuous", "+experiment=x"], sweeper)
    assert plan.jobs == 6 and set(plan.swept) == {"window", "scheduler"}
    assert "scheduler=static,continuous" in plan.sweeps
    assert sweep_plan(["a=1,2"], {"_target_": "optuna.Sweeper"}).jobs is None


# ---- one run -------------------------------------------------------------------------------
@pytest.mark.parametrize("background", [False, True], ids=["this process", "helper process"])
def test_a_run_is_logged_whole(
    tracked: str,
    loaded: tuple[Any, ...],
    tmp_path: Path,
    background: bool,
    figures: dict[str, Any],
) -> None:
    """Everything a run logs, whether this process logs it or the helper process beside the
    engine (`mlflow.background`, framework/tracking/background.py)."""
    experiment = f"single-{background}"
    cfg = make_cfg(
        *STRAGGLER,
        f"mlflow.experiment={experiment}",
        f"mlflow.background={background}",
        "observers=[plots,mlflow]",
    )
    run_with_observers(cfg, tmp_path, loaded)
    (run,) = runs_of(tracked, experiment)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "scheduler=static allocator=incremental preemption=recompute " + (
        "output=immediate"
    )
    params = run.data.params
    flat = flatten(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), skip=["mlflow"])
    assert params == flat  # the whole config, each leaf as the run had it
    assert params["scheduler.name"] == "static" and params["engine.max_num_seqs"] == "4"
    summary = json.loads((tmp_path / "metrics.json").read_text())
    for key in COUNT_KEYS:
        if isinstance(summary.get(key), int | float):
            assert run.data.metrics[key] == pytest.approx(summary[key]), key
    assert run.data.metrics["token_slots"] == 144
    assert run.data.metrics["makespan_s"] == pytest.approx(summary["makespan_s"])
    client = MlflowClient(tracked)
    steps = read_csv(tmp_path / "steps.csv")
    for series in ("step.rows", "step.blocks_in_use", "step.waste_so_far", "step.window"):
        history = client.get_metric_history(run.info.run_id, series)
        assert sorted(m.step for m in history) == list(range(len(steps))), series
    rows = sorted(client.get_metric_history(run.info.run_id, "step.rows"), key=lambda m: m.step)
    assert [m.value for m in rows] == [float(s["rows"]) for s in steps]
    waste = client.get_metric_history(run.info.run_id, "step.waste_so_far")
    assert max(waste, key=lambda m: m.step).value == pytest.approx(summary["waste_fraction"])
    files = {"config.yaml", "metrics.json", "requests.csv", "steps.csv", "outputs.jsonl", *PLOTS}
    assert files <= artifacts(tracked, run.info.run_id)
    assert_plots_show_the_run(tmp_path, figures)  # beside the run too
    for name in PLOTS:  # the artifact is the picture drawn beside the run
        got = client.download_artifacts(run.info.run_id, name, str(tmp_path / "back"))
        assert Path(got).read_bytes() == (tmp_path / name).read_bytes(), name
    tags = run.data.tags
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert tags["git.commit"] == (head.stdout.strip() or "unknown")  # "unknown": no git here
    assert tags["machine.cpu"] == cpu_model() and tags["machine.cores"] == str(os.cpu_count())
    assert tags["machine.gpu"] == "none" or torch.cuda.is_available()
    for package in ("torch", "mlflow", "nanoserve"):
        assert tags[f"version.{package}"] == metadata.version(package), package


@pytest.fixture
def blocked(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite URI that cannot be opened: its folder is a file (MLflow creates missing
    folders, and tests may run as root, so a missing or read-only folder would not do)."""
    file = tmp_path_factory.mktemp("blocked") / "not-a-folder"
    file.write_text("")
    return f"sqlite:///{file}/mlflow.db"


def test_a_long_run_sends_each_series_pooled(
    tracked: str, loaded: tuple[Any, ...], tmp_path: Path
) -> None:
    """Past `mlflow.max_step_points` steps a series is means over runs of steps: bounded,
    covering the whole run, its rows adding up to the run's, its last waste the run's."""
    cfg = make_cfg(*TIGHT, "mlflow.experiment=pooled", "mlflow.max_step_points=8")
    cfg.observers = ["mlflow"]
    run_with_observers(cfg, tmp_path, loaded)
    (run,) = runs_of(tracked, "pooled")
    steps = read_csv(tmp_path / "steps.csv")
    assert len(steps) > 16  # long enough to be pooled twice
    client = MlflowClient(tracked)
    rows = sorted(client.get_metric_history(run.info.run_id, "step.rows"), key=lambda m: m.step)
    assert 4 <= len(rows) <= 8 and rows[-1].step == len(steps) - 1
    at = [m.step for m in rows]
    sizes = [b - a for a, b in zip([-1, *at], at, strict=False)]  # steps each point pools
    pooled = sum(m.value * k for m, k in zip(rows, sizes, strict=True))
    assert pooled == pytest.approx(sum(int(s["rows"]) for s in steps))
    waste = client.get_metric_history(run.info.run_id, "step.waste_so_far")
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert max(waste, key=lambda m: m.step).value == pytest.approx(summary["waste_fraction"])


@pytest.mark.parametrize(
    ("kind", "background"),
    [("sqlite-under-a-file", False), ("closed-port", False), ("sqlite-under-a-file", True)],
)
def test_a_store_that_is_down_costs_the_run_nothing(
    kind: str,
    background: bool,
    blocked: str,
    loaded: tuple[Any, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = blocked if kind == "sqlite-under-a-file" else "http://127.0.0.1:9"
    cfg = make_cfg(
        *STRAGGLER,
        f"mlflow.tracking_uri={uri}",
        f"mlflow.background={background}",
        "observers=[mlflow]",
    )
    run_with_observers(cfg, tmp_path, loaded)
    assert json.loads((tmp_path / "metrics.json").read_text())["tokens_kept"] == 60
    err = capsys.readouterr().err
    assert "MLflow: not logged:" in err and str(tmp_path) in err, err


def test_a_store_failing_half_way_costs_the_run_nothing(
    tracked: str,
    loaded: tuple[Any, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def gone(*args: Any, **kwargs: Any) -> None:
        raise OSError("artifact store unmounted")

    monkeypatch.setattr(MlflowClient, "log_artifact", gone)
    monkeypatch.setattr(MlflowClient, "log_artifacts", gone)
    cfg = make_cfg(*STRAGGLER, "mlflow.experiment=halfway", "observers=[mlflow]")
    run_with_observers(cfg, tmp_path, loaded)
    assert (tmp_path / "metrics.json").is_file()
    err = capsys.readouterr().err
    assert "MLflow: not logged: uploading" in err and "artifact store unmounted" in err, err
    (run,) = runs_of(tracked, "halfway")
    assert run.info.status == "FAILED"  # not left "running" for ever


def test_the_helper_closes_a_run_its_process_left_open(tracked: str) -> None:
    """A run whose process ends without finishing it (killed, say) is closed by the MLflow
    helper as FAILED, saying why, instead of showing as running for ever."""
    helper = BackgroundRun()
    settings = {"tracking_uri": tracked, "experiment": "orphaned", "fatal": False}
    helper.start((settings, "left open", {"nanoserve.kind": "run"}, None, {"seed": "0"}))
    assert helper._proc is not None and helper._proc.stdin is not None
    helper._proc.stdin.close()  # what this process's end looks like to the helper
    assert helper._proc.wait(timeout=120) == 0
    (run,) = runs_of(tracked, "orphaned")
    assert run.info.status == "FAILED" and run.data.params["seed"] == "0"
    assert run.data.tags["nanoserve.error"] == ORPHANED


def test_a_helper_that_cannot_start_costs_the_run_nothing(
    loaded: tuple[Any, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(background_module.sys, "executable", str(tmp_path / "no-python"))
    cfg = make_cfg(*STRAGGLER, "mlflow.background=true", "observers=[mlflow]")
    run_with_observers(cfg, tmp_path, loaded)
    assert json.loads((tmp_path / "metrics.json").read_text())["tokens_kept"] == 60
    err = capsys.readouterr().err
    assert "MLflow: not logged: starting the MLflow helper process failed" in err, err


def test_fatal_makes_a_failing_store_fail_the_run(
    blocked: str, loaded: tuple[Any, ...], tmp_path: Path
) -> None:
    cfg = make_cfg(
        *STRAGGLER,
        f"mlflow.tracking_uri={blocked}",
        "mlflow.fatal=true",
        "observers=[mlflow]",
    )
    with pytest.raises(Exception, match=r"MLflow: starting the run .* failed"):
        run_with_observers(cfg, tmp_path, loaded)


class StopAt:
    """Raises `error` at the end of step 3: a crash, or Ctrl-C."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @hookimpl
    def on_step_end(self, stats: Any) -> None:
        if stats.step == 3:
            raise self.error


@pytest.fixture
def stop_at_step_3() -> Iterator[Callable[[BaseException], None]]:
    """Installs a plugin that raises the given error at the end of step 3."""
    installed: list[StopAt] = []

    def install(error: BaseException) -> None:
        installed.append(StopAt(error))
        registry().pm.register(installed[-1], name="test:stop-at-3")

    yield install
    for plugin in installed:
        registry().pm.unregister(plugin)


@pytest.mark.parametrize(
    ("error", "status", "background"),
    [
        (KeyboardInterrupt(), "KILLED", False),
        (RuntimeError("boom"), "FAILED", False),
        (KeyboardInterrupt(), "KILLED", True),
    ],
)
def test_a_stopped_run_is_logged_as_killed_or_failed(
    error: BaseException,
    status: str,
    background: bool,
    tracked: str,
    loaded: tuple[Any, ...],
    tmp_path: Path,
    stop_at_step_3: Callable[[BaseException], None],
) -> None:
    stop_at_step_3(error)
    experiment = f"abort-{status.lower()}-{background}"
    cfg = make_cfg(
        *STRAGGLER,
        f"mlflow.experiment={experiment}",
        f"mlflow.background={background}",
        "observers=[mlflow]",
    )
    with pytest.raises(BaseException) as raised:
        run_with_observers(cfg, tmp_path, loaded)
    assert isinstance(raised.value, type(error)) or "boom" in str(raised.value)
    (run,) = runs_of(tracked, experiment)
    assert run.info.status == status
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["incomplete"] and run.data.metrics["steps"] == summary["steps"] > 0
    uploaded = MlflowClient(tracked).download_artifacts(
        run.info.run_id, "metrics.json", str(tmp_path / "back")
    )
    assert json.loads(Path(uploaded).read_text()) == summary  # the partial summary, uploaded


# ---- a multirun ----------------------------------------------------------------------------
def test_a_multirun_is_one_parent_with_a_child_per_job(store_uri: str, tmp_path: Path) -> None:
    before = set(os.listdir(ROOT))
    env = {**os.environ, "MLFLOW_TRACKING_URI": store_uri}
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "model=tiny", "workload=straggler",
         "scheduler=static,continuous", "allocator=worst_case,incremental",
         "mlflow.experiment=sweep", "observers=[mlflow]", f"hydra.sweep.dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = runs_of(store_uri, "sweep")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == (
        "sweep: scheduler=static,continuous allocator=worst_case,incremental"
    )
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.info.run_name for c in children) == sorted(
        f"scheduler={s} allocator={a}"
        for s in ("static", "continuous")
        for a in ("worst_case", "incremental")
    )
    assert all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.params["choice.workload"] == "straggler" for c in children)
    swept = MlflowClient(store_uri).download_artifacts(
        parent.info.run_id, "multirun.yaml", str(tmp_path / "back")
    )
    task = list(OmegaConf.load(swept).hydra.overrides.task)
    assert {"scheduler=static,continuous", "allocator=worst_case,incremental"} <= set(task)
    assert set(os.listdir(ROOT)) - before == set()  # no mlflow.db or mlruns/ in the repo


# ---- plots and progress --------------------------------------------------------------------
def test_the_slot_timeline_matches_the_engine_rows(
    loaded: tuple[Any, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    figures: dict[str, Any],
) -> None:
    run_with_observers(make_cfg(*TIGHT, "observers=[progress,plots]"), tmp_path, loaded)
    steps = read_csv(tmp_path / "steps.csv")
    requests = read_csv(tmp_path / "requests.csv")
    assert sum(int(s["preempted"]) for s in steps) > 0  # the case worth drawing
    ends = read_step_columns(tmp_path / "steps.csv")["time"].tolist()
    spans = request_spans(requests, ends)
    placed = assign_lanes(spans)
    for k in (1, len(steps) // 3, len(steps) // 2, len(steps)):  # the slot timeline's cut
        cut = [sp for sp in request_spans(requests, ends, until=k) if sp.start < k]
        assert cut == [sp for sp in spans if sp.start < k]
    per_step = Counter(i for _, sp in placed for i in range(sp.start, sp.end + 1))
    assert [per_step.get(i, 0) for i in range(len(steps))] == [int(s["rows"]) for s in steps]
    assert max(lane for lane, _ in placed) < 6  # never more lanes than slots
    assert sum(sp.preempted for _, sp in placed) == sum(int(s["preempted"]) for s in steps)
    assert_plots_show_the_run(tmp_path, figures)
    assert "requests" not in capsys.readouterr().err  # no progress bar off a terminal


def test_the_plots_read_only_their_columns_of_steps_csv(
    tight_run: tuple[Path, Any], tmp_path: Path, figures: dict[str, Any]
) -> None:
    """A whole day's trace is a million steps: the pictures keep 6 of steps.csv's columns as
    arrays, the same values read back from the file as taken from the run in memory."""
    copy_of(tight_run, tmp_path)
    info = tight_run[1]
    every = read_csv(tmp_path / "steps.csv")
    some = read_step_columns(tmp_path / "steps.csv")
    assert set(some) == set(STEP_PLOT_COLUMNS)
    for c in STEP_PLOT_COLUMNS:
        cast = float if c == "time" else int
        assert some[c].tolist() == [cast(row[c]) for row in every]
    assert some["time"].dtype == np.float64 and some["rows"].dtype == np.int64
    floats = read_step_columns(tmp_path / "steps.csv", ("window", "forward_s"))
    assert floats["forward_s"].tolist() == [float(row["forward_s"]) for row in every]
    assert floats["window"].dtype == np.float64
    kept = step_columns(info.result.steps)
    assert all(kept[c].tolist() == some[c].tolist() for c in STEP_PLOT_COLUMNS)
    with pytest.raises(ValueError, match="no column 'nope'"):
        read_step_columns(tmp_path / "steps.csv", ("step", "nope"))
    drawn = save_run_plots(tmp_path)
    assert drawn == [tmp_path / p for p in PLOTS]
    assert_plots_show_the_run(tmp_path, figures)  # drawn from the file alone


@pytest.mark.parametrize("parallel_steps", [10**9, 1], ids=["one process", "forked workers"])
def test_steps_csv_is_what_the_csv_module_writes(
    tight_run: tuple[Path, Any],
    tmp_path: Path,
    parallel_steps: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """steps.csv is written one `%` a row, and a long run's rows are formatted by forked
    workers in chunks: the same bytes as `csv.writer` either way, a numpy number in a field
    included, and the heap as frozen (or not) afterwards as before."""
    steps = list(tight_run[1].result.steps)  # a copy: the shared run's list stays as it was
    steps[0] = dataclasses.replace(steps[0], window=np.float64(2.5), time=np.float32(0.25))
    monkeypatch.setattr(steps_csv, "CHUNK_STEPS", 7)  # several chunks, the last one short
    frozen = gc.get_freeze_count()
    write_steps(tmp_path / "mine.csv", steps, parallel_steps=parallel_steps)
    assert gc.get_freeze_count() == frozen
    with (tmp_path / "theirs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(STEP_COLUMNS)
        w.writerows(s.values() for s in steps)
    assert (tmp_path / "mine.csv").read_bytes() == (tmp_path / "theirs.csv").read_bytes()
    assert len(steps) > 3 * 7


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-50, 50), min_size=1, max_size=400),
    st.integers(1, 30),
)
def test_a_curves_envelope_keeps_each_buckets_ends_and_extremes(
    values: list[int], buckets: int
) -> None:
    """`envelope` (M4): in order, no index twice, and every run of consecutive points it
    pools keeps its first, last, lowest and highest value, so the drawn curve spans the
    same range in each pixel column as the whole series."""
    y = np.array(values)
    keep = envelope(y, buckets)
    assert keep.tolist() == sorted(set(keep.tolist()))
    assert keep[0] == 0 and keep[-1] == len(y) - 1
    if len(y) <= 4 * buckets:
        assert keep.tolist() == list(range(len(y)))
        return
    width = -(-len(y) // buckets)
    kept = set(keep.tolist())
    for start in range(0, len(y), width):
        part = range(start, min(start + width, len(y)))
        assert part[0] in kept and part[-1] in kept
        mine = [i for i in part if i in kept]
        assert min(y[i] for i in mine) == y[part[0] : part[-1] + 1].min()
        assert max(y[i] for i in mine) == y[part[0] : part[-1] + 1].max()
    assert len(keep) <= 4 * buckets


def test_a_steps_file_without_steps_reads_as_empty_columns(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    path.write_text(",".join(STEP_PLOT_COLUMNS) + "\n")
    got = read_step_columns(path)
    assert all(len(v) == 0 for v in got.values())


def test_a_long_run_draws_the_first_steps_of_its_timeline(
    tight_run: tuple[Path, Any], tmp_path: Path
) -> None:
    """The timeline of a run longer than `max_steps` shows its first steps, and says so."""
    copy_of(tight_run, tmp_path)
    steps = read_step_columns(tmp_path / "steps.csv")
    requests = read_csv(tmp_path / "requests.csv")
    drawn: dict[str, Any] = {}
    real_save = plots_module.save_figure

    def keep(fig: Any, path: Path) -> Path:
        drawn["title"] = fig.axes[0].get_title()
        drawn["xlim"] = fig.axes[0].get_xlim()
        return real_save(fig, path)

    plots_module.save_figure = keep
    try:
        plots_module.plot_slot_timeline(requests, steps, 6, tmp_path / "t.png", max_steps=10)
    finally:
        plots_module.save_figure = real_save
    assert drawn["xlim"] == (0, 10)
    assert f"(the first 10 of {len(steps['step'])})" in drawn["title"]
    assert "differ" not in drawn["title"]  # clipped spans still match the engine's rows


# ---- launchers -----------------------------------------------------------------------------
def compose_launcher(name: str) -> Any:
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose(
            config_name="config",
            overrides=[f"hydra/launcher={name}", "model=tiny"],
            return_hydra_config=True,
        )
    return cfg.hydra.launcher


def test_the_launcher_configs_compose() -> None:
    joblib = compose_launcher("parallel")
    assert joblib._target_.endswith("JoblibLauncher") and joblib.n_jobs == 2
    slurm = compose_launcher("slurm")
    assert slurm._target_.endswith("SlurmLauncher")
    assert slurm.timeout_min == 60 and slurm.cpus_per_task == 4
    assert str(slurm.submitit_folder).endswith(".submitit/%j")


def test_the_ray_launcher_config_fits_the_plugin_schema() -> None:
    """hydra-ray-launcher pulls in Ray (large) and comes with the `ray` extra only: with it,
    the config composes; without it, its body is checked against the plugin's schema
    (`RayLauncherConf`: `_target_`, `ray.init`, `ray.remote`), written out here."""
    try:
        import hydra_plugins.hydra_ray_launcher  # noqa: F401
    except ImportError:
        pass
    else:
        launcher = compose_launcher("ray_cluster")
        assert launcher._target_.endswith("RayLauncher")
        # The plugin's default 75 MB object store makes ray.init() refuse a running cluster.
        assert launcher.ray.init.object_store_memory is None
        assert launcher.ray.remote.num_cpus == 4  # tests/test_ray_cluster.py runs it for real
        return
    body = OmegaConf.load(ROOT / "conf" / "hydra" / "launcher" / "ray_cluster.yaml")
    assert list(body.defaults) == ["ray", "_self_"]
    del body["defaults"]
    schema = OmegaConf.create(
        {
            "_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
            "ray": {"init": {"address": None}, "remote": {}},
        }
    )
    OmegaConf.set_struct(schema, True)  # fixed fields: `_target_`, `ray.init`, `ray.remote`
    for free in (schema.ray.init, schema.ray.remote):  # Dict[str, Any] in the plugin
        OmegaConf.set_struct(free, False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", "ray://head:10001")
        merged = OmegaConf.merge(schema, body)  # an unknown top-level field would raise
        resolved = OmegaConf.to_container(merged, resolve=True)
    assert set(resolved) == {"_target_", "ray"} and set(resolved["ray"]) == {"init", "remote"}
    assert resolved["ray"]["init"]["address"] == "ray://head:10001"
    assert resolved["ray"]["init"]["object_store_memory"] is None
    assert "MLFLOW_TRACKING_URI" in resolved["ray"]["init"]["runtime_env"]["env_vars"]
