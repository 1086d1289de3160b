"""`python serve.py` as a user runs it: a subprocess on a free port of 127.0.0.1, driven
over HTTP, stopped by SIGINT, leaving the run folder and the MLflow run as `run.py` does;
and a user's config mistake as one `error:` line."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, assert_refused, cli

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx2")  # what `openai` uses


def test_sigint_writes_the_run_folder_and_the_mlflow_run(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable, "serve.py", "model=tiny", "output=deferred", "window=2",
            "server.port=0", "server.stop_after_s=120", f"hydra.run.dir={tmp_path}",
            "observers=[console,mlflow]", "mlflow.background=false",
            "engine.packed_linears=false", "engine.paged_kernel=false",
            "engine.argmax_kernel=false",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = None
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        said = []
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            said.append(line)
            found = re.search(r"serving tiny on http://127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        assert port is not None, proc.stderr.read() if proc.stderr else ""
        assert said[0].startswith("nanoserve: serving · scheduler="), said  # no request count
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as http:
            for n in (3, 5):
                r = http.post(
                    "/v1/completions",
                    json={"prompt": "Hello", "max_tokens": n, "ignore_eos": True},
                )
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert (tmp_path / "serve.log").is_file()  # the log named after the command
    assert "Warning" not in err, err[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["requests"] == 2 and metrics["requests_finished"] == 2
    assert metrics["tokens_kept"] == 8 and metrics["incomplete"] is False
    with (tmp_path / "requests.csv").open() as f:
        assert sorted(int(r["output_tokens"]) for r in csv.DictReader(f)) == [3, 5]
    assert (tmp_path / "steps.csv").is_file() and (tmp_path / "outputs.jsonl").is_file()
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs(
        [client.get_experiment_by_name("nanoserve").experiment_id],
        filter_string=f"tags.`nanoserve.output_dir` = '{tmp_path.resolve()}'",
    )
    assert run.info.status == "FINISHED" and run.data.metrics["tokens_kept"] == 8
    assert run.data.params["output.name"] == "deferred"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("executor.pace=wall", "executor.pace=wall applies to executor=simulated"),
        ("server.port=70000", "server.port must be 0"),
        ("server.max_waiting=-1", "server.max_waiting must be >= 0"),
        ("server.max_body_bytes=0", "server.max_body_bytes must be >= 1"),
        ("server.api_key=' '", "server.api_key must not be empty"),
        ("server.bogus=1", "server.bogus is not a setting of the server group"),
        ("cluster.replicas=2", "serve.py serves one engine"),
    ],
)
def test_config_mistakes_are_one_line(capsys, tmp_path: Path, override: str, expected: str):
    from framework.serve.cli import main

    capsys.readouterr()
    status = main(["model=tiny", override, f"hydra.run.dir={tmp_path}", "observers=[]"])
    assert_refused(status, capsys.readouterr().err, expected)


def test_pace_is_refused_by_run_py_for_the_model(capsys, tmp_path: Path) -> None:
    status, _, err = cli(capsys, "model=tiny", "executor.pace=wall", f"hydra.run.dir={tmp_path}")
    assert_refused(status, err, "executor.pace=wall applies to executor=simulated")
