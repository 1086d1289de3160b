"""The classic studies run as users run them (`python run.py +experiment=NAME model=tiny`)
and write a table with every column, a CSV and a plot; the batching study is logged to
MLflow as a parent run holding its table; a comparison of runs that produced different
tokens is refused. (Numbers are measured by running the studies, never asserted here.)

Two studies are shrunk from the command line (fewer windows, a shorter trace slice), so the
suite stays quick; the configs themselves run in full in `make run`-style use.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from experiments.policy.studies import STUDIES, DifferentWork, StudyReport, load_sweep, write_report
from tests.helpers import ROOT

TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"
SHRINK = {
    "batching": [],
    "allocation": [],
    "deferral": ["workload.limit=3", "workload.max_tokens=6", "window=0,2"],
    "chunking": [],
    "prefix": [],
    "trace": [
        "workload.limit=4",
        "workload.max_prompt_tokens=32",
        "workload.max_output_tokens=4",
        "workload.time_scale=0",
        "scheduler=static,sjf",
    ],
}


def run_study(name: str, sweep_dir: Path, uri: str, *extra: str) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.run(
        [sys.executable, "run.py", f"+experiment={name}", "model=tiny", *SHRINK[name],
         *extra, f"hydra.sweep.dir={sweep_dir}", f"mlflow.experiment=study-{name}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def batching(tmp_path_factory: pytest.TempPathFactory, uri: str) -> Path:
    """The batching study, logged as it is by default (every observer, MLflow included)."""
    sweep = tmp_path_factory.mktemp("batching")
    run_study("batching", sweep, uri)
    return sweep


def check_table(name: str, sweep: Path, runs: int) -> list[dict[str, str]]:
    study = STUDIES[name]
    with (sweep / f"{name}.csv").open() as f:
        rows = list(csv.DictReader(f))
    expected = [label for label, _ in study.labels] + [col for col, _ in study.columns]
    assert list(rows[0]) == expected
    assert len(rows) == runs
    md = (sweep / f"{name}.md").read_text()
    assert "| " + " | ".join(expected) + " |" in md and "Counts hold on any machine" in md
    assert (sweep / f"{name}.png").stat().st_size > 0
    return rows


def test_batching_study(batching: Path, uri: str) -> None:
    rows = check_table("batching", batching, 4)
    assert [(r["workload"], r["scheduler"]) for r in rows] == [
        ("straggler", "static"),
        ("straggler", "continuous"),
        ("spread", "static"),
        ("spread", "continuous"),
    ]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("study-batching")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("nanoserve.kind") == "sweep"]
    assert parent.info.run_name.startswith("study batching: ")
    assert {"batching.md", "batching.csv", "batching.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4


@pytest.mark.parametrize(
    ("name", "runs"), [("allocation", 2), ("deferral", 2), ("trace", 4)]
)  # fmt: skip
def test_study_writes_every_column(name: str, runs: int, tmp_path: Path, uri: str) -> None:
    if name == "trace" and not TRACE.is_file():
        pytest.skip(f"the Azure trace is not at {TRACE}")
    extra = [f"workload.path={TRACE}"] if name == "trace" else []
    run_study(name, tmp_path, uri, "observers=[console]", *extra)
    check_table(name, tmp_path, runs)


def test_a_comparison_of_different_tokens_is_refused(batching: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    shutil.copytree(batching, sweep, ignore=shutil.ignore_patterns("batching.*"))
    outputs = sweep / "1" / "outputs.jsonl"  # straggler, continuous: compared with job 0
    lines = [json.loads(line) for line in outputs.read_text().splitlines()]
    lines[2]["output_token_ids"][-1] += 1
    outputs.write_text("".join(json.dumps(o) + "\n" for o in lines))
    with pytest.raises(DifferentWork, match="different tokens for request r2"):
        write_report("batching", load_sweep(sweep), {}, sweep)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    with pytest.raises(SystemExit, match="not comparing different work"):
        StudyReport("batching").on_multirun_end(config)
    assert not (sweep / "batching.md").exists()
    assert "request r2" in (sweep / "batching.refused.txt").read_text()
    # The other workload's runs (jobs 2, 3) still compare: only a group's own runs must match.
    shutil.rmtree(sweep / "0")
    shutil.rmtree(sweep / "1")
    write_report("batching", load_sweep(sweep), {}, sweep)


def test_a_genuine_tie_is_accepted_and_listed(batching: Path) -> None:
    """Where two runs first differ at a genuine fp32 tie, the comparison goes on (the
    project's tie rule); the tie check decides, and anything it rejects is refused."""
    from experiments.policy.studies import check_same_work

    runs = load_sweep(batching)
    runs[1].outputs = {**runs[1].outputs, "r2": [*runs[1].outputs["r2"][:-1], 7]}
    same_workload = STUDIES["batching"].group
    ties = check_same_work(runs, same_workload, lambda run, ref, rid: f"{rid}: a tie")
    assert ties == ["r2: a tie"]
    with pytest.raises(DifferentWork, match="request r2"):
        check_same_work(runs, same_workload, lambda run, ref, rid: None)


def test_chunking_study_on_the_simulated_executor(tmp_path: Path, uri: str) -> None:
    if not TRACE.is_file():
        pytest.skip(f"the Azure trace is not at {TRACE}")
    run_study(
        "chunking",
        tmp_path,
        uri,
        "observers=[console]",
        "executor=simulated",
        "executor.profile=smollm2-float32-amd-epyc-zen4",
        "executor.any_profile=true",  # SmolLM2's seconds, the tiny model's shape
        f"workload.path={TRACE}",
        "workload.limit=12",
    )
    rows = check_table("chunking", tmp_path, 4)
    assert [r["chunk_size"] for r in rows] == ["off", "64", "256", "512"]
    chunks = [int(r["prefill_chunks"]) for r in rows]
    assert chunks[0] == 12 and chunks[1] > chunks[2] >= chunks[3] >= 12
    md = (tmp_path / "chunking.md").read_text()
    assert "Simulated" in md and "measured profile smollm2-float32" in md


def test_prefix_study_on_the_simulated_executor(tmp_path: Path, uri: str) -> None:
    run_study(
        "prefix",
        tmp_path,
        uri,
        "observers=[console]",
        "executor=simulated",
        "executor.profile=smollm2-float32-amd-epyc-zen4",
        "executor.any_profile=true",
        "workload.num_prefixes=2",
        "workload.questions_per_prefix=4",
        "workload.prefix_tokens=64",
        "engine.num_blocks=12",
    )
    rows = check_table("prefix", tmp_path, 4)
    by = {(r["allocator"], r["scheduler"]): r for r in rows}
    assert float(by["incremental", "continuous"]["prefix_hit_rate"]) == 0
    assert float(by["prefix_cache", "lpm"]["prefix_hit_rate"]) > 0
    assert int(by["prefix_cache", "lpm"]["prefill_tokens"]) < int(
        by["incremental", "lpm"]["prefill_tokens"]
    )
