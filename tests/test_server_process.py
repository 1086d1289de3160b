"""The server with its engine in a process of its own (`server.engine=process`, the
default): the same answers as a batch run, aborts and the drain across the pipe, the
engine's hook calls reaching this process's observers, a setting the engine refuses said
in one line, and an engine process that dies taking the server down with an error rather
than leaving clients waiting. Servers on 127.0.0.1, bounded in time, the tiny model."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pluggy
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx2")

from framework.core.request import RequestSpec, SamplingParams  # noqa: E402
from framework.plugin_host.registry import registry  # noqa: E402
from framework.run.errors import UserError  # noqa: E402
from framework.serve.engine_client import EngineClient  # noqa: E402
from tests.helpers import make_cfg, run_engine  # noqa: E402
from tests.test_server import DEFERRED, EOS, FIXED, PROMPTS, loaded, served  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
hookimpl = pluggy.HookimplMarker("nanoserve")


def answers_of(info: dict[str, Any]) -> dict[str, list[int]]:
    """Each request's tokens, from the run's result (the engine's, sent back at the end)."""
    return {s.id: s.output_token_ids for s in info["run"].result.seqs}


@pytest.mark.parametrize("output", [[], DEFERRED], ids=["immediate", "deferred"])
def test_greedy_answers_are_those_of_a_batch_run(tiny, tmp_path, output: list[str]) -> None:
    model, tok = tiny
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    specs = [RequestSpec(f"r{i}", p, SamplingParams(max_tokens=10)) for i, p in enumerate(ids)]
    batch = run_engine(make_cfg(*FIXED, *output), model, tok, specs)
    want = {s.id: s.output_token_ids for s in batch.seqs}
    with served(tmp_path, *FIXED, *output, loaded=loaded(tiny), engine="process") as s:
        assert isinstance(s.running.loop, EngineClient)
        client = s.client()

        def ask(i: int) -> Any:
            return client.completions.create(
                model="tiny", prompt=ids[i], max_tokens=10, temperature=0
            )

        def streamed(i: int) -> str:
            parts = client.completions.create(
                model="tiny", prompt=ids[i], max_tokens=10, temperature=0, stream=True
            )
            return "".join(p.choices[0].text for p in parts if p.choices)

        with ThreadPoolExecutor(2 * len(ids)) as pool:
            whole = list(pool.map(ask, range(len(ids))))
            texts = list(pool.map(streamed, range(len(ids))))
        names = {a.id: f"r{i}" for i, a in enumerate(whole)}
        for i, a in enumerate(whole):
            assert a.choices[0].text == tok.decode(want[f"r{i}"], skip_special_tokens=True)
            assert texts[i] == a.choices[0].text
        assert s.metric("request_success_total") == 2 * len(ids)
        assert s.metric("engine_steps_total") > 0
    got = answers_of(s.info)
    for rid, name in names.items():
        assert got[rid] == want[name]
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["incomplete"] is False


def test_disconnect_aborts_across_the_pipe_and_the_server_goes_on(tiny, tmp_path) -> None:
    with served(tmp_path, *FIXED, *DEFERRED, loaded=loaded(tiny), engine="process") as s:
        client = s.client()
        stream = client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=1500, extra_body=EOS, stream=True
        )
        for got, _ in enumerate(stream, start=1):
            if got == 3:
                break
        assert s.metric("kv_cache_blocks_used") > 0
        stream.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 20
        while s.metric("request_aborted_total") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.metric("request_aborted_total") == 1
        assert s.metric("kv_cache_blocks_used") == 0
        assert s.running.loop.in_flight() == 0
        r = client.completions.create(
            model="tiny", prompt="Hi", max_tokens=3, n=2, temperature=1.0, seed=3,
            extra_body=EOS,
        )  # fmt: skip
        assert [c.index for c in r.choices] == [0, 1]
        assert r.usage.completion_tokens == 6
        too_long = httpx.post(
            f"{s.url}/v1/completions",
            json={"model": "tiny", "prompt": [1] * 5000, "max_tokens": 4},
            timeout=30,
        )
        assert too_long.status_code == 400 and "error" in too_long.json()
    assert s.info["run"].summary["aborted"] == 1  # the books, checked in the engine process


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


def test_engine_hooks_reach_this_process_observers(tiny, tmp_path) -> None:
    rec = Recorder()
    pm = registry().pm
    pm.register(rec, name="test:recorder")
    try:
        with served(tmp_path, *FIXED, loaded=loaded(tiny), engine="process") as s:
            r = s.client().completions.create(
                model="tiny", prompt=PROMPTS[0], max_tokens=5, extra_body=EOS
            )
            deadline = time.monotonic() + 20
            while r.id not in rec.finished and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        pm.unregister(rec)
    assert rec.finished == [r.id]
    steps = len(s.info["run"].result.steps)
    assert rec.steps == list(range(steps))  # every step, once, in order


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
