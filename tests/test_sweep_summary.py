"""A sweep reads at a glance: while it runs, one line per job (what it varied, requests,
makespan, tokens/s) instead of every answer and both metric tables; at its end one
comparison table, one row per job, then where the results are (the sweep folder, the MLflow
parent run), also written as `sweep.md` / `sweep.csv` and uploaded to the parent run. A job
that failed is a row that says so.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from omegaconf import OmegaConf

from framework.tracking.sweep_table import (
    METRIC_COLUMNS,
    SweepTable,
    sweep_rows,
    write_sweep_table,
)
from framework.tracking.tags import tracking_uri
from tests.helpers import ROOT

JOB_LINE = re.compile(
    r"^\[(\d+)/(\d+)\] (\S+): (\d+) requests, makespan [0-9.e+-]+ s, [0-9.]+ tokens/s$"
)


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of the rich table(s) in `stdout`, as cells."""
    return [
        [c.strip() for c in line.strip("│").split("│")]
        for line in stdout.splitlines()
        if line.startswith("│")
    ]


def test_a_sweep_prints_a_line_per_job_then_one_table(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "model=tiny", "workload=straggler",
         "scheduler=static,continuous", "mlflow.experiment=sweep-summary",
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    lines = out.splitlines()

    # While it runs: one line per job, nothing else of the job's own.
    jobs = [m.groups() for line in lines if (m := JOB_LINE.match(line))]
    assert jobs == [
        ("1", "2", "scheduler=static", "8"),
        ("2", "2", "scheduler=continuous", "8"),
    ], out
    for banned in ("counts (any machine)", "times (this machine)", "results in ", "nanoserve: "):
        assert banned not in out, banned
    for job in ("0", "1"):
        for o in map(json.loads, (sweep / job / "outputs.jsonl").read_text().splitlines()):
            if len(o["text"].strip()) > 12:  # long enough not to turn up by chance
                assert o["text"].strip() not in out, o["text"]

    # At the end: one table, one row per job with its swept value and its numbers.
    header = next(line for line in lines if line.startswith("┃"))
    cols = [c.strip() for c in header.strip("┃").split("┃")]
    assert cols == ["job", "scheduler", *METRIC_COLUMNS, "status"]
    rows = table_rows(out)
    assert [r[:2] for r in rows] == [["0", "static"], ["1", "continuous"]]
    for row in rows:
        metrics = json.loads((sweep / row[0] / "metrics.json").read_text())
        cells = dict(zip(cols, row, strict=True))
        assert cells["status"] == "ok"
        assert cells["token_slots"] == str(metrics["token_slots"])
        assert cells["requests_finished"] == "8"
    with (sweep / "sweep.csv").open() as f:
        assert [(r["job"], r["scheduler"]) for r in csv.DictReader(f)] == [
            ("0", "static"),
            ("1", "continuous"),
        ]
    assert "| job | scheduler | requests_finished |" in (sweep / "sweep.md").read_text()

    # Then where the results are, the MLflow parent run last.
    assert lines[-2] == f"sweep folder: {sweep.resolve()}"
    parent_line = re.fullmatch(
        r"MLflow parent run: (\w+) \(finished; experiment 'sweep-summary', "
        r"`mlflow ui --backend-store-uri (\S+)`\)",
        lines[-1],
    )
    assert parent_line, lines[-1]
    run_id, uri = parent_line.groups()
    assert uri == tracking_uri(OmegaConf.create({"tracking_uri": None}))
    client = MlflowClient(uri)
    parent = client.get_run(run_id)
    assert parent.data.tags["nanoserve.kind"] == "sweep"
    assert {"sweep.md", "sweep.csv"} <= {a.path for a in client.list_artifacts(run_id)}
    # The order: the job lines, then the table, then the two lines.
    first_table_line = lines.index(header)
    assert max(i for i, line in enumerate(lines) if JOB_LINE.match(line)) < first_table_line


def write_job(sweep: Path, name: str, overrides: list[str], metrics: dict[str, Any] | None) -> None:
    (sweep / name / ".hydra").mkdir(parents=True)
    (sweep / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (sweep / name / "metrics.json").write_text(json.dumps(metrics))


def test_the_table_has_a_row_per_job_and_says_which_failed(tmp_path: Path, capsys: Any) -> None:
    done = {
        "requests": 8,
        "requests_finished": 8,
        "steps": 32,
        "token_slots": 60,
        "waste_fraction": 0.0,
        "occupancy": 0.1171875,
        "preemptions": 0,
        "makespan_s": 1.23456,
        "output_tokens_per_s": 48.6,
        "ttft_p50_s": 0.0123,
        "tpot_p50_s": None,
        "incomplete": False,
    }
    stopped = {**done, "requests_finished": 3, "incomplete": True, "error": "PolicyError: boom"}
    base = ["model=tiny", "workload=straggler"]
    write_job(tmp_path, "0", [*base, "scheduler=static", "allocator=worst_case"], done)
    write_job(tmp_path, "1", [*base, "scheduler=continuous", "allocator=worst_case"], stopped)
    write_job(tmp_path, "10", [*base, "scheduler=continuous", "allocator=incremental"], None)
    write_job(tmp_path, "2", [*base, "scheduler=static", "allocator=incremental"], done)
    (tmp_path / "not_a_job").mkdir()

    rows = sweep_rows(tmp_path, ["scheduler", "allocator"])
    assert [(r["job"], r["scheduler"], r["allocator"], r["status"]) for r in rows] == [
        ("0", "static", "worst_case", "ok"),
        ("1", "continuous", "worst_case", "incomplete: PolicyError: boom"),
        ("2", "static", "incremental", "ok"),
        ("10", "continuous", "incremental", "failed: no metrics.json"),
    ]
    assert list(rows[0]) == ["job", "scheduler", "allocator", *METRIC_COLUMNS, "status"]
    assert rows[1]["requests_finished"] == 3  # what a stopped job measured is still shown
    assert all(rows[3][k] is None for k in METRIC_COLUMNS)

    md = write_sweep_table(rows, tmp_path, "sweep: scheduler=static,continuous")
    text = md.read_text()
    # The studies' format: four significant digits, `-` for what a run does not define.
    first = "| 0 | static | worst_case | 8 | 32 | 60 | 0 | 0.1172 | 0 | 1.235 | 48.6 | 0.0123 | - |"
    assert first + " ok |" in text
    assert "| 10 | continuous | incremental | - | - |" in text
    with (tmp_path / "sweep.csv").open() as f:
        assert [r["status"] for r in csv.DictReader(f)][1] == "incomplete: PolicyError: boom"

    # The callback, as Hydra calls it: the table, then the folder; a study's own table wins.
    sweeps = ["scheduler=static,continuous", "allocator=worst_case,incremental"]
    basic = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    config = OmegaConf.create(
        {
            "hydra": {
                "sweep": {"dir": str(tmp_path)},
                "overrides": {"task": sweeps},
                "sweeper": {"_target_": basic},
                "callbacks": {},
            }
        }
    )
    table = SweepTable()
    table.on_multirun_start(config)
    table.on_multirun_end(config)
    out = capsys.readouterr().out
    assert "sweep: scheduler=static,continuous allocator=worst_case,incremental (2 of 4" in out
    assert [r[0] for r in table_rows(out)] == ["0", "1", "2", "10"]
    assert out.rstrip().endswith(f"sweep folder: {tmp_path.resolve()}")

    config.hydra.callbacks = {"study": {"name": "batching"}}
    (tmp_path / "batching.md").write_text("## the study's table\n")
    table.on_multirun_start(config)
    table.on_multirun_end(config)
    out = capsys.readouterr().out
    assert not table_rows(out) and out.strip() == f"sweep folder: {tmp_path.resolve()}"
    assert (tmp_path / "sweep.md").is_file()  # still written, for the parent run
