"""The server with its engine in a process of its own (`server.engine=process`, the
default): samples and refusals across the pipe, the engine's hook calls reaching this
process's observers, greedy answers against a batch run's (immediate output; deferred output
and aborts across the pipe are tests/test_server.py's), a setting the engine refuses said in
one line, and an engine process that dies taking the server down with an error rather than
leaving clients waiting.
Servers on 127.0.0.1, bounded in time, the tiny model."""

from __future__ import annotations

import json
import time
from typing import Any

import pluggy
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx2")

from framework.plugin_host.registry import registry  # noqa: E402
from framework.run.errors import UserError  # noqa: E402
from tests.test_server import (  # noqa: E402
    EOS,
    FIXED,
    PROMPTS,
    ask_greedy,
    batch_answers,
    check_served_tokens,
    loaded,
    served,
)

pytestmark = pytest.mark.usefixtures("one_thread")
hookimpl = pluggy.HookimplMarker("nanoserve")


class Recorder:
    """An observer registered in this process: the engine's calls must reach it."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.finished: list[str] = []

    @hookimpl
    def on_step_end(self, stats: Any) -> None:
        self.steps.append(stats.step)

    @hookimpl
    def on_request_finished(self, request: Any) -> None:
        self.finished.append(request.id)


def test_samples_refusals_hooks_and_greedy_answers_cross_the_pipe(tiny, tmp_path) -> None:
    """One engine process with immediate output (each start imports torch anew, the cost of
    these tests): samples and a refusal cross the pipe; greedy answers, whole and streamed,
    concurrently, are a batch run's tokens (with deferred output: tests/test_server.py); and
    every hook call of the engine reaches an observer registered in this process, each step
    once and in order, each finished request once."""
    ids, want = batch_answers(tiny, [])  # before the observer: its calls are the server's
    rec = Recorder()
    pm = registry().pm
    pm.register(rec, name="test:recorder")
    try:
        with served(tmp_path, *FIXED, loaded=loaded(tiny), engine="process") as s:
            client = s.client()
            sampled = client.completions.create(
                model="tiny", prompt="Hi", max_tokens=3, n=2, temperature=1.0, seed=3,
                extra_body=EOS,
            )  # fmt: skip
            assert [c.index for c in sampled.choices] == [0, 1]
            assert sampled.usage.completion_tokens == 6
            too_long = httpx.post(
                f"{s.url}/v1/completions",
                json={"model": "tiny", "prompt": [1] * 5000, "max_tokens": 4},
                timeout=30,
            )
            assert too_long.status_code == 400 and "error" in too_long.json()
            assert s.running.loop.in_flight() == 0
            answers, streams = ask_greedy(s, tiny[1], ids, want)
            # Every request's call, once (the refused one never ran): the samples' by their
            # own ids, the greedy ones' whole and streamed.
            finished = [f"{sampled.id}#0", f"{sampled.id}#1", *(a.id for a in answers)]
            finished = sorted([*finished, *streams])
            deadline = time.monotonic() + 20
            while sorted(rec.finished) != finished and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        pm.unregister(rec)
    assert sorted(rec.finished) == finished, rec.finished
    steps = len(s.info["run"].result.steps)
    assert rec.steps == list(range(steps))  # every step, once, in order
    check_served_tokens(s, answers, want)
    assert json.loads((tmp_path / "metrics.json").read_text())["incomplete"] is False


def test_a_setting_the_engine_refuses_is_one_line(tiny, tmp_path) -> None:
    refused = served(
        tmp_path, *FIXED, "engine.kv_memory_mb=0.00001", loaded=loaded(tiny), engine="process"
    )
    with pytest.raises(UserError, match=r"engine\.kv_memory_mb"), refused:
        pass


def test_an_engine_process_that_dies_stops_the_server_with_an_error(tiny, tmp_path) -> None:
    server = served(tmp_path, *FIXED, loaded=loaded(tiny), engine="process")
    with pytest.raises(RuntimeError, match="engine process exited"), server as s:
        client = s.client()
        stream = client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=1500, extra_body=EOS, stream=True
        )
        next(iter(stream))
        s.running.loop.process.kill()  # type: ignore[attr-defined]
        with pytest.raises(Exception):  # noqa: B017 (the stream ends in an error)
            for _ in stream:
                pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{s.url}/health", timeout=5).status_code == 503:
                    break
            except httpx.TransportError:
                break  # already stopped
            time.sleep(0.05)
    assert (tmp_path / "metrics.json").exists()  # the failed run's marker, written
