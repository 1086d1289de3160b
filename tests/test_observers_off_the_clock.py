"""No observer runs anything beside the engine's steps. The MLflow helper process: the store and
the run are open before the first step, the helper uses no CPU while the engine steps, and what
the run waited for is its start-up (framework/tracking/background.py). The progress bar starts
no monitor thread. Nothing here is timed: the helper's CPU is read from /proc in clock ticks."""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow import MlflowClient

from framework.api.hookspecs import hookimpl
from framework.plugin_host.registry import registry
from framework.run.observers import run_with_observers
from framework.tracking.background import BackgroundRun
from plugins.observers.progress import Bar
from tests.helpers import make_cfg

LINUX = sys.platform.startswith("linux")
# Enough steps that a helper busy beside them (importing mlflow, making a store) would show.
QUEUE = [
    "model=tiny",
    "workload=fixed",
    "workload.prompt_lens=[16,16,16,16,16,16,16,16]",
    "workload.output_lens=[64,64,64,64,64,64,64,64]",
    "engine.max_num_seqs=4",
]


def cpu_ticks(pid: int) -> int:
    """User + system clock ticks process `pid` has used (/proc/PID/stat, fields 14-15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def state(pid: int) -> str:
    """The process's state letter: R running, S sleeping (blocked on its pipe), ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store in a folder of its own: the first run there makes and migrates it."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_the_helper_opens_the_run_before_start_returns(store: str, tmp_path: Path) -> None:
    """`start` returns once the run is open in a new store, its params logged. Nothing is
    written before it is called."""
    assert not (tmp_path / "store").exists()
    helper = BackgroundRun()
    settings = {"tracking_uri": store, "experiment": "ready", "fatal": False}
    helper.start((settings, "ready", {"nanoserve.kind": "run"}, None, {"seed": "3"}))
    assert helper.broken is None
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("ready").experiment_id])
    assert run.info.status == "RUNNING" and run.data.params == {"seed": "3"}
    run_id, broken = helper.finish(("FINISHED", {}, {"tokens": 5}, [], []))
    assert broken is None and run_id == run.info.run_id
    assert client.get_run(run_id).info.status == "FINISHED"


class StepSpy:
    """At each step's end: whether the MLflow run is in the store yet, and the helper's CPU
    ticks and state."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.run_open_at_first_step: bool | None = None
        self.ticks: list[int] = []
        self.states: list[str] = []

    @hookimpl
    def on_step_end(self, stats: Any) -> None:
        helper = registry().pm.get_plugin("observer:mlflow").background
        assert helper is not None and helper.pid is not None
        self.ticks.append(cpu_ticks(helper.pid))
        self.states.append(state(helper.pid))
        if self.run_open_at_first_step is None:
            client = MlflowClient(self.store)
            exp = client.get_experiment_by_name("off-the-clock")
            runs = client.search_runs([exp.experiment_id]) if exp is not None else []
            self.run_open_at_first_step = len(runs) == 1 and "seed" in runs[0].data.params


@pytest.fixture
def spy(store: str) -> Iterator[StepSpy]:
    plugin = StepSpy(store)
    registry().pm.register(plugin, name="test:step-spy")
    yield plugin
    registry().pm.unregister(plugin)


@pytest.mark.skipif(not LINUX, reason="reads the helper's CPU from /proc")
def test_the_helper_is_done_before_the_first_step_and_idle_while_the_engine_runs(
    store: str, tiny: tuple[Any, Any], tmp_path: Path, spy: StepSpy
) -> None:
    """A run with a fresh store: the store is made and the run opened before the engine's
    first step, the helper uses no CPU from the first step to the last (it sleeps on its
    pipe), and the wait is in metrics.json as start-up, outside every request's times."""
    model, tok = tiny
    cfg = make_cfg(
        *QUEUE,
        "mlflow.experiment=off-the-clock",
        "mlflow.background=true",
        "observers=[mlflow]",
    )
    run_with_observers(cfg, tmp_path / "run", (model, tok, torch.device("cpu"), torch.float32))
    assert spy.run_open_at_first_step is True
    assert len(spy.ticks) > 20
    # Asleep on its pipe: at most the one clock tick its reply's last instructions may be
    # charged (a helper importing mlflow or making a store beside the steps takes hundreds).
    assert spy.ticks[-1] - spy.ticks[0] <= 1, "the helper used CPU while the engine stepped"
    assert spy.states[-1] == "S" and spy.states.count("S") >= len(spy.states) - 1
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert summary["startup_observers_s"] > 0 and summary["startup_load_s"] >= 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("off-the-clock").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["startup_observers_s"] == pytest.approx(summary["startup_observers_s"])


def test_the_progress_bar_starts_no_thread() -> None:
    """A bar drawn on a terminal, as the progress observer makes it, without tqdm's monitor
    thread (which would wake beside the engine every ten seconds)."""
    before = set(threading.enumerate())
    bar = Bar(total=3, disable=False, file=io.StringIO())
    bar.update(1)
    assert set(threading.enumerate()) == before
    bar.close()
