"""The classic studies run as users run them (`python run.py +experiment=NAME model=tiny`)
and write a table with every column, a CSV and a plot of a panel per drawn column; the
batching study is logged to MLflow as a parent run holding its table; a comparison of runs
that produced different tokens is refused. Each table is checked for what its study shows
(the same work in every row, counts that add up, the effect the study is about); the
seconds are measured by running the studies, never asserted here.

Two studies are shrunk from the command line (fewer windows, a shorter trace slice), so the
suite stays quick; the configs themselves run in full in `make run`-style use. The command
line runs in the test's process (`framework.run.cli.main`, what `run.py` calls): a
subprocess would import torch and the rest again for every study, most of a small study's
cost. The batching study runs once, in one test, for everything asked of it (its table, its
MLflow runs, and the refusals made on copies of its folder): split over tests, xdist would
run it once on each worker that takes one of them.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from framework.run.cli import main
from framework.studies.classic import STUDIES
from framework.studies.study_report import StudyReport, write_report
from framework.studies.sweep_runs import DifferentWork, check_same_work, load_sweep
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
    # The first 30 requests of the Mooncake slice stretched to about 80 s, so that replica
    # 1's failure at 60 s falls inside the run; one router; a pool the tiny model's size
    # (the experiment's 60 GB of it would be millions of blocks).
    "failover": [
        "engine.kv_memory_mb=16",
        "workload.limit=30",
        "workload.time_scale=10",
        "workload.max_output_tokens=8",
        'hydra.sweeper.params.router="round_robin"',
    ],
}


def run_study(name: str, sweep_dir: Path, uri: str, *extra: str) -> None:
    """`python run.py +experiment=NAME model=tiny ...` with $MLFLOW_TRACKING_URI at `uri`,
    run in this process; it must exit 0."""
    args = [f"+experiment={name}", "model=tiny", *SHRINK[name], *extra,
            f"hydra.sweep.dir={sweep_dir}", f"mlflow.experiment=study-{name}"]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(ROOT)  # where `python run.py` is run from: the configs' relative paths
        assert main(args) == 0, f"python run.py {' '.join(args)} failed"


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's (width, height), from its header; anything else is no PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def check_table(name: str, sweep: Path, runs: int) -> list[dict[str, str]]:
    study = STUDIES[name]
    with (sweep / f"{name}.csv").open() as f:
        rows = list(csv.DictReader(f))
    expected = [label for label, _ in study.labels] + [col for col, _ in study.columns]
    assert list(rows[0]) == expected
    assert len(rows) == runs
    md = (sweep / f"{name}.md").read_text()
    assert "| " + " | ".join(expected) + " |" in md and "Counts hold on any machine" in md
    assert len(md.splitlines()) >= 4 + runs  # title, heading, header, rule, a line a run
    # One panel per drawn column, 3.2 x 3.6 inches at 100 dpi (`plot_bars`).
    assert png_size(sweep / f"{name}.png") == (320 * len(study.plot), 360)
    return rows


def f(row: dict[str, str], col: str) -> float:
    return float(row[col])


def test_batching_study(tmp_path: Path, uri: str) -> None:
    """The batching study, logged as it is by default (every observer, MLflow included): its
    table and MLflow runs, then the refusals checked on its folder (below)."""
    batching = tmp_path / "batching"
    run_study("batching", batching, uri)
    check_batching(batching, uri)
    a_comparison_of_different_tokens_is_refused(batching, tmp_path / "refused")
    a_genuine_tie_is_accepted_and_listed(batching)


def check_batching(batching: Path, uri: str) -> None:
    rows = check_table("batching", batching, 4)
    assert [(r["workload"], r["scheduler"]) for r in rows] == [
        ("straggler", "static"),
        ("straggler", "continuous"),
        ("spread", "static"),
        ("spread", "continuous"),
    ]
    kept = {"straggler": 4 * 7 + 32, "spread": 5 + 8 + 6 + 120 + 7 + 9 + 6 + 11}
    for workload in kept:
        static, continuous = (r for r in rows if r["workload"] == workload)
        for r in (static, continuous):  # the same work under both schedulers
            assert r["requests"] == "8" and int(r["tokens_kept"]) == kept[workload]
            waste = 1 - f(r, "tokens_kept") / f(r, "token_slots")
            assert f(r, "waste_fraction") == pytest.approx(waste)
        # Static batching computes its finished rows until the batch's slowest ends;
        # continuous batching evicts them, wasting no slot, in no more steps.
        assert int(continuous["token_slots"]) == kept[workload] < int(static["token_slots"])
        assert int(continuous["steps"]) <= int(static["steps"])
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
    ("name", "runs"), [("allocation", 2), ("deferral", 2), ("trace", 4), ("failover", 2)]
)  # fmt: skip
def test_study_writes_every_column(name: str, runs: int, tmp_path: Path, uri: str) -> None:
    if name == "trace" and not TRACE.is_file():
        pytest.skip(f"the Azure trace is not at {TRACE}")
    extra = [f"workload.path={TRACE}"] if name == "trace" else []
    run_study(name, tmp_path, uri, "observers=[console]", *extra)
    CHECKS[name](check_table(name, tmp_path, runs))


def allocation_holds(rows: list[dict[str, str]]) -> None:
    """Worst-case booking never preempts; incremental admits at least as many rows at once,
    in the same pool of 16 blocks."""
    by = {r["allocator"]: r for r in rows}
    worst, incremental = by["worst_case"], by["incremental"]
    assert worst["preemptions"] == worst["recomputed_tokens"] == "0"
    for r in rows:
        assert r["requests"] == "12" and r["num_blocks"] == "16"
        assert int(r["peak_blocks"]) <= 16 and int(r["peak_rows"]) <= 8
        assert f(r, "mean_rows") <= int(r["peak_rows"])
        assert (int(r["recomputed_tokens"]) > 0) == (int(r["preemptions"]) > 0)
    assert f(incremental, "mean_rows") >= f(worst, "mean_rows")


def deferral_holds(rows: list[dict[str, str]]) -> None:
    """A window of 2 reads the tokens back half as often as window 0, on the same work."""
    by = {r["window"]: r for r in rows}
    assert set(by) == {"0", "2"} and {r["requests"] for r in rows} == {"3"}
    for r in rows:
        assert f(r, "transfers_per_step") == pytest.approx(f(r, "transfers") / f(r, "steps"))
    assert by["0"]["transfers"] == by["0"]["steps"] and by["0"]["overshoot_tokens"] == "0"
    assert f(by["2"], "transfers_per_step") < f(by["0"], "transfers_per_step")


def trace_holds(rows: list[dict[str, str]]) -> None:
    """Every request of the slice finishes; percentiles are ordered; goodput is the share
    that met the SLO, per second of makespan."""
    combos = {(r["scheduler"], r["allocator"]) for r in rows}
    assert combos == {(s, a) for s in ("static", "sjf") for a in ("worst_case", "incremental")}
    for r in rows:
        assert r["requests_finished"] == "4"
        for metric in ("ttft", "tpot", "e2e"):
            p50, p90, p99 = (f(r, f"{metric}_p{q}_s") for q in (50, 90, 99))
            assert 0 <= p50 <= p90 <= p99
        assert 0 <= f(r, "slo_met") <= 1
        met = f(r, "slo_met") * int(r["requests_finished"])
        assert f(r, "goodput_rps") == pytest.approx(met / f(r, "makespan_s"))


def failover_holds(rows: list[dict[str, str]]) -> None:
    """The same requests finish with and without replica 1's failure (the study has checked
    they got the same tokens); only the faulted run counts a failure."""
    by = {r["fault"]: r for r in rows}
    assert set(by) == {"none", "1 down 60-180 s"}
    assert by["none"]["requests_finished"] == by["1 down 60-180 s"]["requests_finished"]
    assert by["none"]["replica_failures"] == by["none"]["requests_rerouted"] == "0"
    assert by["1 down 60-180 s"]["replica_failures"] == "1"


CHECKS = {
    "allocation": allocation_holds,
    "deferral": deferral_holds,
    "trace": trace_holds,
    "failover": failover_holds,
}


def a_comparison_of_different_tokens_is_refused(batching: Path, sweep: Path) -> None:
    """A copy of the batching sweep with one token changed is refused, by name."""
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


def a_genuine_tie_is_accepted_and_listed(batching: Path) -> None:
    """Where two runs first differ at a genuine fp32 tie, the comparison goes on (the
    project's tie rule); the tie check decides, and anything it rejects is refused."""
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
