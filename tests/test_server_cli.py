"""`python serve.py` as a user runs it: a subprocess on a free port of 127.0.0.1, driven
over HTTP, stopped by SIGINT or SIGTERM (a drain: 503s while in-flight streams finish),
leaving the run folder and the MLflow run as `run.py` does; and a user's config mistake as
one `error:` line."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, assert_refused, cli

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx2")  # what `openai` uses


class Serve:
    """`serve.py` in a subprocess, once it accepts: its process, its URL, what it printed."""

    def __init__(self, proc: subprocess.Popen[str], url: str, said: list[str]) -> None:
        self.proc, self.url, self.said = proc, url, said

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120) -> tuple[str, str]:
        """Send `sig`; its stdout (the rest) and stderr once it has exited."""
        self.proc.send_signal(sig)
        return self.proc.communicate(timeout=timeout)


@contextmanager
def serve(tmp_path: Path, *overrides: str) -> Iterator[Serve]:
    """`serve.py model=tiny` on a free port of 127.0.0.1, bounded (`server.stop_after_s`)
    and killed on leaving if it is still up."""
    proc = subprocess.Popen(
        [
            sys.executable, "serve.py", "model=tiny", "server.port=0",
            "server.stop_after_s=120", f"hydra.run.dir={tmp_path}", *overrides,
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
        yield Serve(proc, f"http://127.0.0.1:{port}", said)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigint_writes_the_run_folder_and_the_mlflow_run(tmp_path: Path) -> None:
    with serve(
        tmp_path, "output=deferred", "window=2", "observers=[console,mlflow]",
        "mlflow.background=false", "engine.packed_linears=false",
        "engine.paged_kernel=false", "engine.argmax_kernel=false",
    ) as s:  # fmt: skip
        said = s.said
        assert said[0].startswith("nanoserve: serving · scheduler="), said  # no request count
        with httpx.Client(base_url=s.url, timeout=30) as http:
            for n in (3, 5):
                r = http.post(
                    "/v1/completions",
                    json={"prompt": "Hello", "max_tokens": n, "ignore_eos": True},
                )
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n
        _, err = s.stop(signal.SIGINT)
    assert s.proc.returncode == 0, err[-3000:]
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


# The tiny model simulated on an H100's profile, paced on the wall clock and slowed so that
# each token takes about 35 ms: a stream lasts seconds, whatever this machine's speed.
PACED = ["executor=simulated", "executor.pace=wall", "executor.speed=0.005", "observers=[]"]


@contextmanager
def open_stream(http: Any, max_tokens: int) -> Iterator[Iterator[str]]:
    """A streamed completion's lines, its first token already read."""
    body = {
        "prompt": "Hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        yield lines


def rest(lines: Iterator[str]) -> tuple[list[str], dict[str, Any] | None]:
    """A stream's remaining chunks to `[DONE]`: the finish reasons given, and its usage."""
    finishes, use = [], None
    for line in lines:
        if line == "data: [DONE]":
            break
        if line.startswith("data: "):
            chunk = json.loads(line.removeprefix("data: "))
            finishes += [c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]]
            use = chunk.get("usage") or use
    return finishes, use


def wait_for_drain(http: Any) -> Any:
    """/health once the server drains (503), polled for a bounded while."""
    deadline = time.monotonic() + 10
    while (r := http.get("/health")).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    return r


def test_sigterm_drains_with_503s_while_a_stream_finishes_and_a_second_one_stops(
    tmp_path: Path,
) -> None:
    """SIGTERM with two streams in flight: the server still listens, answers new requests
    and /health with 503 in OpenAI's schema (counted in /metrics, which still answers), lets
    the short stream send all its tokens; then a second SIGTERM aborts the long one at once
    (finish reason `abort`, long before it would have ended, and before the 60 s drain
    ends), the process exits 0 and its run folder is complete: one request finished, one
    aborted. (The drain and the second signal share one serve.py: each start imports torch
    twice, in the front end and in the engine's process.)"""
    with serve(tmp_path, *PACED, "server.shutdown_timeout_s=60") as s:
        # a stream of 120 tokens, about 4 s, beside one of 1000 tokens, about 35 s
        with (
            httpx.Client(base_url=s.url, timeout=30) as http,
            open_stream(http, 120) as short,
            open_stream(http, 1000) as long,
        ):
            s.proc.send_signal(signal.SIGTERM)
            health = wait_for_drain(http)
            assert health.status_code == 503
            assert health.json()["error"]["type"] == "service_unavailable"
            r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            error = r.json()["error"]
            assert error["type"] == "service_unavailable"
            assert "shutting down" in error["message"]
            assert http.get("/v1/models").status_code == 503
            scrape = http.get("/metrics")
            assert scrape.status_code == 200
            assert 'request_refused_total{model_name="tiny",status="503"} 2.0' in scrape.text
            assert 'num_requests_running{model_name="tiny"} 2.0' in scrape.text
            finishes, use = rest(short)
            assert finishes == ["length"] and use is not None
            assert use["completion_tokens"] == 120
            s.proc.send_signal(signal.SIGTERM)  # the second: what is in flight stops now
            t0 = time.monotonic()
            finishes, cut = rest(long)
            ended = time.monotonic() - t0
        assert finishes == ["abort"] and cut is not None
        assert 0 < cut["completion_tokens"] < 1000
        assert ended < 15, ended  # not the stream's 35 s, nor the 60 s drain
        out, err = s.proc.communicate(timeout=60)
    assert s.proc.returncode == 0, err[-3000:]
    assert "stopping: new requests are answered 503 while the 2 in flight finish" in out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["requests"] == 2 and metrics["requests_finished"] == 1
    assert metrics["aborted"] == 1 and metrics["incomplete"] is False
    rows = {r["finish_reason"]: r for r in csv.DictReader((tmp_path / "requests.csv").open())}
    assert sorted(rows) == ["abort", "length"]
    assert int(rows["length"]["output_tokens"]) == 120
    assert int(rows["abort"]["output_tokens"]) == cut["completion_tokens"]


def test_a_stream_past_the_drain_is_aborted(tmp_path: Path) -> None:
    """A stream that outlasts `server.shutdown_timeout_s`: the stream ends with finish
    reason `abort`, the process exits 0 long before the stream would have ended, and the run
    folder is complete, the request aborted. (A second signal during the drain is the test
    above's.)"""
    with serve(tmp_path, *PACED, "server.shutdown_timeout_s=1") as s:
        # a stream of 1000 tokens: about 35 s
        with httpx.Client(base_url=s.url, timeout=30) as http, open_stream(http, 1000) as lines:
            s.proc.send_signal(signal.SIGTERM)
            assert wait_for_drain(http).status_code == 503
            t0 = time.monotonic()
            finishes, use = rest(lines)
            ended = time.monotonic() - t0
        assert finishes == ["abort"] and use is not None
        assert 0 < use["completion_tokens"] < 1000
        assert ended < 15, ended  # not the stream's 35 s
        _, err = s.proc.communicate(timeout=60)
    assert s.proc.returncode == 0, err[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["requests"] == 1 and metrics["aborted"] == 1
    assert metrics["incomplete"] is False
    (row,) = csv.DictReader((tmp_path / "requests.csv").open())
    assert row["finish_reason"] == "abort"
    assert int(row["output_tokens"]) == use["completion_tokens"]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("executor.pace=wall", "executor.pace=wall applies to executor=simulated"),
        ("server.port=70000", "server.port must be 0"),
        ("server.max_waiting=-1", "server.max_waiting must be >= 0"),
        ("server.max_body_bytes=0", "server.max_body_bytes must be >= 1"),
        ("server.switch_interval_ms=0", "server.switch_interval_ms must be > 0"),
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
