"""The HTTP server against a client nobody here wrote (the official `openai` package), on
servers started in this process on a free port of 127.0.0.1, each bounded in time
(`server.stop_after_s`) and stopped as SIGINT stops it, its engine's books checked whole
(`Engine.finish`) at the end of every test."""

from __future__ import annotations

import csv
import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")  # what `openai` uses

from framework.core.request import RequestSpec, SamplingParams  # noqa: E402
from framework.core.sequence import Sequence  # noqa: E402
from framework.plugin_host.registry import registry  # noqa: E402
from framework.run.run_info import RunInfo  # noqa: E402
from framework.serve.server import Running, serve_http  # noqa: E402
from tests.helpers import hf_greedy, make_cfg, run_engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# Kernels fixed rather than timed at each start (`auto`): the same on both sides of a
# comparison with a batch run, and a faster start.
FIXED = [
    "model=tiny",
    "engine.packed_linears=false",
    "engine.paged_kernel=false",
    "engine.argmax_kernel=false",
]
DEFERRED = ["output=deferred", "window=4"]
EOS = {"ignore_eos": True}  # vLLM's field, which the `openai` client sends as extra_body


@dataclass
class Served:
    running: Running
    url: str
    out: Path
    info: dict[str, Any]

    def client(self) -> Any:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=60)

    def seq(self, rid: str) -> Sequence:
        return next(s for s in self.running.loop.engine.seqs if s.id == rid)

    def metric(self, name: str) -> float:
        return self.metrics()[name]

    def metrics(self) -> dict[str, float]:
        """One scrape: every `nanoserve:` sample without labels' detail, by name."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("nanoserve:") and not line.startswith("nanoserve:server"):
                key = line.split(" ", 1)[0].split("{", 1)[0].removeprefix("nanoserve:")
                out.setdefault(key, float(line.rsplit(" ", 1)[1]))
        return out


@contextmanager
def served(
    tmp_path: Path, *overrides: str, loaded: Any = None, engine: str = "thread"
) -> Iterator[Served]:
    """A server in a thread of this process; stopped (as by SIGINT) on leaving, which runs
    the engine empty, checks its books and writes the run folder into `tmp_path`. Its
    engine loop runs in a thread (`engine`), where a test can look inside the engine, unless
    the test is of the engine's own process."""
    cfg = make_cfg(
        *overrides, "server.port=0", "server.stop_after_s=120", "observers=[]",
        f"server.engine={engine}",
    )  # fmt: skip
    ready: queue.Queue[Running | None] = queue.Queue()
    info: dict[str, Any] = {}

    def target() -> None:
        try:
            info["run"] = serve_http(cfg, tmp_path, registry().pm.hook, loaded, ready.put)
        except BaseException as error:
            info["error"] = error
            ready.put(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    running = ready.get(timeout=120)
    if running is None:
        raise info["error"]
    try:
        yield Served(running, f"http://127.0.0.1:{running.port}", tmp_path, info)
    finally:
        running.stop()
        thread.join(60)
    assert not thread.is_alive(), "the server did not stop"
    if "error" in info:
        raise info["error"]


def loaded(tiny: Any) -> tuple[Any, ...]:
    return (tiny[0], tiny[1], torch.device("cpu"), torch.float32)


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "Water boils at",
]


def test_openai_client_streams_and_answers_whole(tiny, tmp_path) -> None:
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        client = s.client()
        models = client.models.list().data
        assert [m.id for m in models] == ["tiny"]

        whole = client.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=9, temperature=0, extra_body=EOS
        )
        assert whole.choices[0].finish_reason == "length"
        seq = s.seq(whole.id)
        assert whole.usage.prompt_tokens == seq.prompt_len
        assert whole.usage.completion_tokens == len(seq.output_token_ids) == 9
        assert whole.choices[0].text == tiny[1].decode(seq.output_token_ids)

        chunks = list(
            client.completions.create(
                model="tiny", prompt=PROMPTS[0], max_tokens=9, temperature=0, extra_body=EOS,
                stream=True, stream_options={"include_usage": True},
            )
        )  # fmt: skip
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
        assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens

        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        chat = client.chat.completions.create(
            model="tiny", messages=messages, max_completion_tokens=7, temperature=0
        )
        seq = s.seq(chat.id)
        template = tiny[1].apply_chat_template(messages, add_generation_prompt=True)
        assert seq.spec.prompt_token_ids == list(template["input_ids"])
        assert chat.usage.prompt_tokens == len(template["input_ids"])
        assert chat.usage.completion_tokens == len(seq.output_token_ids)
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=7, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        parts = list(stream)
        assert parts[0].choices[0].delta.role == "assistant"
        text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        assert text == chat.choices[0].message.content
        assert parts[-1].usage.completion_tokens == chat.usage.completion_tokens

        # A stop string ends the answer before it, across token boundaries; the engine is
        # told to stop the request there, and usage counts the tokens up to it.
        text = whole.choices[0].text
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        cut = client.completions.create(
            model="tiny",
            prompt=PROMPTS[0],
            max_tokens=9,
            temperature=0,
            stop=[stop],
            extra_body=EOS,
        )
        assert cut.choices[0].text == text[: text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"
        assert cut.usage.completion_tokens < 9
        deadline = time.monotonic() + 20  # the engine is told after the answer went out
        while s.seq(cut.id).finish_reason is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.seq(cut.id).finish_reason == "stop_string"

        # A seed makes sampling reproducible; another seed draws another answer.
        def sample(seed: int) -> str:
            r = client.completions.create(
                model="tiny", prompt=PROMPTS[2], max_tokens=12, temperature=1.0, seed=seed,
                extra_body=EOS,
            )  # fmt: skip
            return r.choices[0].text

        assert sample(7) == sample(7)
        assert sample(7) != sample(8)


def batch_answers(tiny: Any, output: list[str]) -> tuple[list[list[int]], dict[str, list[int]]]:
    """PROMPTS' token ids, and the tokens a batch run of them gives (10 each, greedy)."""
    model, tok = tiny
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    specs = [RequestSpec(f"r{i}", p, SamplingParams(max_tokens=10)) for i, p in enumerate(ids)]
    batch = run_engine(make_cfg(*FIXED, *output), model, tok, specs)
    return ids, {s.id: s.output_token_ids for s in batch.seqs}


def ask_greedy(
    s: Served, tok: Any, ids: list[list[int]], want: dict[str, list[int]]
) -> tuple[list[Any], list[str]]:
    """Each prompt asked whole and streamed, all at once: each answer the batch run's
    tokens, each stream the same text. The whole answers, in PROMPTS' order, and the
    streams' request ids."""
    client = s.client()
    before = s.metrics().get("request_success_total", 0.0)  # what it answered earlier

    def ask(i: int) -> Any:
        return client.completions.create(model="tiny", prompt=ids[i], max_tokens=10, temperature=0)

    def streamed(i: int) -> tuple[str, str]:
        parts = list(
            client.completions.create(
                model="tiny", prompt=ids[i], max_tokens=10, temperature=0, stream=True
            )
        )
        return parts[0].id, "".join(p.choices[0].text for p in parts if p.choices)

    with ThreadPoolExecutor(2 * len(ids)) as pool:
        answers = list(pool.map(ask, range(len(ids))))
        streams = list(pool.map(streamed, range(len(ids))))
    for i, a in enumerate(answers):
        assert a.choices[0].text == tok.decode(want[f"r{i}"], skip_special_tokens=True)
        assert streams[i][1] == a.choices[0].text
    assert s.metric("request_success_total") == before + 2 * len(ids)
    return answers, [rid for rid, _ in streams]


def check_served_tokens(s: Served, answers: list[Any], want: dict[str, list[int]]) -> None:
    """The run's own record, sent back by the engine at the end: the batch run's tokens."""
    served_tokens = {q.id: q.output_token_ids for q in s.info["run"].result.seqs}
    for i, a in enumerate(answers):
        assert served_tokens[a.id] == want[f"r{i}"]


# With the engine in a process of its own (each start imports torch anew), the same
# comparison shares a server with other checks: deferred output
# `test_an_engine_process_answers_as_a_batch_run_and_frees_a_gone_stream`'s, immediate
# output tests/test_server_process.py's `test_samples_refusals_hooks_and_greedy_answers_...`.
@pytest.mark.parametrize("output", [[], DEFERRED], ids=["immediate", "deferred"])
def test_greedy_answers_are_those_of_a_batch_run(tiny, tmp_path, output: list[str]) -> None:
    """Whole and streamed, concurrently, with the engine in a thread of the server's
    process: the tokens of a batch run of the same prompts."""
    ids, want = batch_answers(tiny, output)
    with served(tmp_path, *FIXED, *output, loaded=loaded(tiny), engine="thread") as s:
        answers, _ = ask_greedy(s, tiny[1], ids, want)
    check_served_tokens(s, answers, want)
    assert json.loads((tmp_path / "metrics.json").read_text())["incomplete"] is False


def disconnect_mid_stream(s: Served, engine: str) -> None:
    """A client gone mid-stream: its request aborted, its blocks freed (across the pipe
    when the engine runs in a process of its own), and the server goes on serving."""
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
    if engine == "thread":
        assert s.running.loop.engine.pool.num_used == 0  # the pool, as the engine sees it
    # ... and the server goes on serving
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=3, extra_body=EOS)
    assert r.usage.completion_tokens == 3


def check_one_abort(s: Served, tmp_path: Path, finished: int) -> None:
    """The run's books after `disconnect_mid_stream`: the one abort counted where the engine
    ran and in the run folder, beside `finished` requests run to their length."""
    assert s.info["run"].summary["aborted"] == 1  # the books, checked where the engine ran
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["aborted"] == 1 and metrics["incomplete"] is False
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert sorted(r["finish_reason"] for r in rows) == ["abort"] + ["length"] * finished
    aborted = next(r for r in rows if r["finish_reason"] == "abort")
    assert 3 <= int(aborted["output_tokens"]) < 1500


def test_disconnect_mid_stream_aborts_and_frees_blocks(tiny, tmp_path) -> None:
    """With the engine in a thread: a client gone mid-stream frees its blocks, and the
    server goes on serving. (Across the pipe of an engine process:
    `test_an_engine_process_answers_as_a_batch_run_and_frees_a_gone_stream`.)"""
    with served(tmp_path, *FIXED, *DEFERRED, loaded=loaded(tiny), engine="thread") as s:
        disconnect_mid_stream(s, "thread")
    check_one_abort(s, tmp_path, finished=1)


def test_an_engine_process_answers_as_a_batch_run_and_frees_a_gone_stream(tiny, tmp_path) -> None:
    """The engine in a process of its own, with deferred output, on one server (its start
    imports torch anew): the answers, whole and streamed, are a batch run's tokens; then a
    client gone mid-stream is aborted across the pipe, its blocks freed, and the server goes
    on serving."""
    ids, want = batch_answers(tiny, DEFERRED)
    with served(tmp_path, *FIXED, *DEFERRED, loaded=loaded(tiny), engine="process") as s:
        answers, _ = ask_greedy(s, tiny[1], ids, want)
        disconnect_mid_stream(s, "process")
    check_served_tokens(s, answers, want)
    check_one_abort(s, tmp_path, finished=2 * len(ids) + 1)


def test_a_client_gone_before_its_whole_answer_is_aborted(tiny, tmp_path) -> None:
    """A request answered whole (no stream) whose client gives up waiting, queued behind a
    long stream in the one row: aborted where it waits, then the stream's own request when
    it is closed; every block freed, and the server goes on serving."""
    with served(tmp_path, *FIXED, "engine.max_num_seqs=1", loaded=loaded(tiny)) as s:
        client = s.client()
        long = client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=1500, extra_body=EOS, stream=True
        )
        next(iter(long))  # running, in the one row
        impatient = client.with_options(timeout=0.5, max_retries=0)
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model="tiny", prompt="Hi", max_tokens=8, extra_body=EOS)
        for aborted in (1, 2):
            deadline = time.monotonic() + 20
            while s.metric("request_aborted_total") < aborted and time.monotonic() < deadline:
                time.sleep(0.05)
            assert s.metric("request_aborted_total") == aborted
            long.close()  # then the stream's client goes away too
        assert s.running.loop.engine.pool.num_used == 0
        r = client.completions.create(model="tiny", prompt="Hi", max_tokens=3, extra_body=EOS)
        assert r.usage.completion_tokens == 3
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert sorted(r["finish_reason"] for r in rows) == ["abort", "abort", "length"]
    assert sorted(int(r["output_tokens"]) for r in rows)[0] == 0  # it never ran


def test_sixteen_concurrent_streams_finish_with_exact_usage(tiny, tmp_path) -> None:
    with served(tmp_path, *FIXED, *DEFERRED, "engine.max_num_seqs=6", loaded=loaded(tiny)) as s:
        client = s.client()

        def one(i: int) -> tuple[str, int, int, str, str | None]:
            stream = client.completions.create(
                model="tiny", prompt=PROMPTS[i % 4] * (1 + i % 3), max_tokens=5 + 3 * i,
                temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            text, rid, use, finish = "", "", None, None
            for c in stream:
                rid = c.id
                if c.choices:
                    text += c.choices[0].text
                    finish = c.choices[0].finish_reason or finish
                if c.usage is not None:
                    use = c.usage
            return rid, use.prompt_tokens, use.completion_tokens, text, finish

        # /metrics scraped throughout: each scrape one moment of the engine's books.
        scrapes: list[dict[str, float]] = []
        done = threading.Event()

        def scrape() -> None:
            while not done.is_set():
                scrapes.append(s.metrics())

        scraper = threading.Thread(target=scrape)
        scraper.start()
        try:
            with ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(one, range(16)))
        finally:
            done.set()
            scraper.join(30)
        assert len(scrapes) > 1
        counters = ("generation_tokens_total", "prompt_tokens_total", "engine_steps_total")
        for before, now in itertools.pairwise(scrapes):
            assert 0 <= now["num_requests_running"] <= 6
            assert now["num_requests_waiting"] >= 0
            assert 0 <= now["kv_cache_blocks_used"] <= now["kv_cache_blocks_total"]
            assert all(now[c] >= before[c] for c in counters)
        assert len({a[0] for a in answers}) == 16
        total = sum(a[2] for a in answers)
        deadline = time.monotonic() + 30  # the loop takes its state after the step's tokens
        while s.metric("generation_tokens_total") < total and time.monotonic() < deadline:
            time.sleep(0.01)
        last = s.metrics()
        assert last["generation_tokens_total"] == total
        assert last["num_requests_running"] == last["num_requests_waiting"] == 0
        for i, (rid, prompt, completion, text, finish) in enumerate(answers):
            seq = s.seq(rid)
            assert (prompt, completion) == (seq.prompt_len, len(seq.output_token_ids))
            assert completion <= 5 + 3 * i and finish == seq.finish_reason
            assert text == tiny[1].decode(seq.output_token_ids, skip_special_tokens=True)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["requests_finished"] == 16 and metrics["aborted"] == 0


def test_past_the_queue_bound_answers_429(tiny, tmp_path) -> None:
    with served(
        tmp_path, *FIXED, "engine.max_num_seqs=1", "server.max_waiting=1", loaded=loaded(tiny)
    ) as s:
        client = s.client()
        long = {"model": "tiny", "prompt": "Hi", "max_tokens": 1500, "extra_body": EOS}
        first = client.completions.create(**long, stream=True)
        next(iter(first))  # running
        second = client.completions.create(**long, stream=True)  # accepted: it waits
        with pytest.raises(openai.RateLimitError) as refused:
            client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert refused.value.status_code == 429
        assert "server.max_waiting" in refused.value.body["message"]
        first.close()
        second.close()
        deadline = time.monotonic() + 20
        while s.metric("request_aborted_total") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = client.completions.create(model="tiny", prompt="Hi", max_tokens=2, extra_body=EOS)
        assert r.usage.completion_tokens == 2


BAD = [
    ("/v1/completions", b'{"prompt": "Hi", ', None, "not valid JSON"),
    ("/v1/completions", {"prompt": "Hi", "foo": 1}, "foo", "unknown field 'foo'"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": "many"}, "max_tokens", ""),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens", ""),
    ("/v1/completions", {"max_tokens": 3}, "prompt", "'prompt' is required"),
    ("/v1/completions", {"prompt": "Hi", "n": 3, "best_of": 2}, "best_of", "best_of=2 is below"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs", ""),
    ("/v1/completions", {"prompt": "Hi", "n": 17}, "n", "n=17 samples cannot run side by side"),
    ("/v1/completions", {"prompt": ""}, "prompt", "at least 1 character"),
    ("/v1/completions", {"prompt": [10, 99999999]}, "prompt", "outside the vocabulary"),
    ("/v1/completions", [1, 2], None, ""),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 5000}, "max_tokens", "context"),
    ("/v1/chat/completions", {"messages": []}, "messages", ""),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, None, ""),
]


def test_malformed_requests_get_4xx_in_the_error_schema(tiny, tmp_path) -> None:
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        with httpx.Client(base_url=s.url, timeout=30) as http:
            for path, body, param, says in BAD:
                if isinstance(body, bytes):
                    r = http.post(path, content=body, headers={"content-type": "application/json"})
                else:
                    r = http.post(path, json=body)
                assert r.status_code == 400, (body, r.text)
                error = r.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["type"] == "invalid_request_error" and says in error["message"]
                if param is not None:
                    assert error["param"] == param, (body, error)
            r = http.post("/v1/completions", json={"model": "gpt-9", "prompt": "Hi"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
            r = http.get("/v1/nothing")
            assert r.status_code == 404 and "error" in r.json()
            assert http.get("/health").status_code == 200
        r = s.client().completions.create(prompt="Hi", model="tiny", max_tokens=2)
        assert r.usage.completion_tokens == 2  # still serving
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["requests_rejected"] == 1  # the one too long for the context


def test_an_api_key_and_a_body_bound_are_refused_in_the_error_schema(
    tiny, tmp_path, monkeypatch
) -> None:
    """`server.api_key` (here from NANOSERVE_API_KEY): no key or a wrong one is 401 on every
    /v1 route, /health stays open; a body over `server.max_body_bytes` is 413 before it is
    parsed. Each refusal is OpenAI's error schema, and the next request is served."""
    monkeypatch.setenv("NANOSERVE_API_KEY", "sesame")
    with served(tmp_path, *FIXED, "server.max_body_bytes=2000", loaded=loaded(tiny)) as s:
        with httpx.Client(base_url=s.url, timeout=30) as http:
            body = {"prompt": "Hi", "max_tokens": 2}
            for headers in ({}, {"Authorization": "Bearer open"}, {"Authorization": "sesame"}):
                r = http.post("/v1/completions", json=body, headers=headers)
                assert r.status_code == 401, r.text
                error = r.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["type"] == "authentication_error"
                assert error["code"] == "invalid_api_key"
            assert http.get("/v1/models").status_code == 401
            assert http.get("/health").status_code == 200
            key = {"Authorization": "Bearer sesame"}
            assert http.get("/v1/models", headers=key).status_code == 200
            big = {"prompt": "word " * 1000, "max_tokens": 2}
            r = http.post("/v1/completions", json=big, headers=key)
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and "2000" in error["message"]
            r = http.post("/v1/completions", json=body, headers=key)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
            # Sent in chunks, without Content-Length: measured as read, then parsed as sent.
            for sent, status in ((body, 200), (big, 413)):
                data = json.dumps(sent).encode()
                pieces = iter([data[:7], data[7:]])
                chunked = {**key, "Content-Type": "application/json"}
                r = http.post("/v1/completions", content=pieces, headers=chunked)
                assert r.status_code == status, r.text
                assert "content-length" not in r.request.headers
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="sesame", max_retries=0)
        assert client.completions.create(prompt="Hi", model="tiny", max_tokens=2).usage


def test_paced_simulator_sends_no_token_before_its_predicted_time(tmp_path) -> None:
    """An 8B on an analytic H100, paced on the wall clock: each token reaches the client no
    sooner after the request left than the profile says it exists after its arrival.
    (A lower bound only: what this machine adds on top is not asserted.)"""
    overrides = [
        "model=hf",
        "model.path=framework/executors/simulated/models/llama-8b",
        "dtype=bfloat16",
        "executor=simulated",
        "executor.hardware=h100-sxm",
        "executor.pace=wall",
        "engine.num_blocks=256",
    ]
    with served(tmp_path, *overrides) as s:
        models = s.client().models.list().data[0]
        said = models.model_extra["nanoserve"]
        assert said["cost_model"] == "analytic" and said["pace"] == "wall"
        assert "h100" in said["profile"]
        # An open loop of requests, each timed from the moment it is sent
        sent, seen = {}, {}

        def one(i: int) -> str:
            time.sleep(0.05 * i)
            t0 = time.perf_counter()
            stream = s.client().completions.create(
                model=models.id, prompt=[1000 + i] * 200, max_tokens=24, extra_body=EOS,
                stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
            )  # fmt: skip
            marks = []
            for c in stream:
                if c.choices and c.usage is not None:
                    marks.append((c.usage.completion_tokens, time.perf_counter() - t0))
                rid = c.id
            sent[rid], seen[rid] = t0, marks
            return rid

        with ThreadPoolExecutor(4) as pool:
            rids = list(pool.map(one, range(4)))
        for rid in rids:
            seq = s.seq(rid)
            assert len(seq.output_token_ids) == 24
            for k, at in seen[rid]:
                predicted = seq.token_times[k - 1] - seq.arrival
                assert at >= predicted - 1e-3, (rid, k, at, predicted)
            # The profile's timing, not this machine's: 24 decode steps of an 8B on an H100
            # take milliseconds each, and the client waited them out.
            assert seq.finished_at - seq.arrival > 24 * 0.003
            assert seen[rid][-1][1] >= seq.finished_at - seq.arrival - 1e-3
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["clock"] == "virtual" and metrics["cost_model"] == "analytic"


def test_stop_after_requests_drains_as_sigterm_does(tmp_path) -> None:
    """`server.stop_after_requests` stops as SIGTERM does: once the request that reaches the
    bound is answered, new requests and /health get 503 while a stream already in flight
    goes on to its last token; then the server stops by itself. (The tiny model simulated,
    paced and slowed to about 35 ms a token, so the stream outlasts the checks.)"""
    paced = ["executor=simulated", "executor.pace=wall", "executor.speed=0.005"]
    with served(tmp_path, "model=tiny", *paced, "server.stop_after_requests=1") as s:
        client = s.client()
        stream = iter(
            client.completions.create(
                model="tiny", prompt="Hi", max_tokens=60, extra_body=EOS, stream=True
            )
        )
        next(stream)
        client.completions.create(model="tiny", prompt="Hi", max_tokens=2, extra_body=EOS)
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert refused.value.status_code == 503
        assert refused.value.body["type"] == "service_unavailable"
        assert httpx.get(f"{s.url}/health", timeout=10).status_code == 503
        assert s.metric("num_requests_running") == 1
        assert [c.choices[0].finish_reason for c in stream][-1] == "length"
        s.running.loop.thread.join(30)  # the drain over, the engine loop ends by itself
        assert not s.running.loop.thread.is_alive()
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert sorted(int(r["output_tokens"]) for r in rows) == [2, 60]
    assert {r["finish_reason"] for r in rows} == {"length"}


def test_run_info_is_returned(tiny, tmp_path) -> None:
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        s.client().completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert isinstance(s.info["run"], RunInfo)
    assert s.info["run"].summary["requests"] == 1
    for name in ("metrics.json", "requests.csv", "steps.csv", "outputs.jsonl", "config.yaml"):
        assert (tmp_path / name).is_file()


def test_n_choices_whole_and_streamed_with_their_indices(tiny, tmp_path) -> None:
    """`n` (and `best_of` equal to it): n choices over one prompt's blocks, each the answer
    of its sample; greedy, n copies of one answer; streamed, each chunk names its choice."""
    model, tok = tiny
    ids = tok.encode(PROMPTS[2], add_special_tokens=False)
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        client = s.client()
        whole = client.completions.create(
            model="tiny", prompt=ids, max_tokens=6, temperature=0, n=3, best_of=3,
            extra_body=EOS,
        )  # fmt: skip
        want = tok.decode(hf_greedy(model, ids, 6, None))
        assert [c.index for c in whole.choices] == [0, 1, 2]
        assert [c.text for c in whole.choices] == [want] * 3
        assert whole.usage.completion_tokens == 18 and whole.usage.prompt_tokens == len(ids)
        assert [len(s.seq(f"{whole.id}#{k}").output_token_ids) for k in range(3)] == [6] * 3

        sampled = client.completions.create(
            model="tiny", prompt=ids, max_tokens=8, temperature=1.0, seed=3, n=2, extra_body=EOS
        )
        texts = [c.text for c in sampled.choices]
        assert texts[0] != texts[1]
        chunks = list(
            client.completions.create(
                model="tiny", prompt=ids, max_tokens=8, temperature=1.0, seed=3, n=2,
                extra_body=EOS, stream=True, stream_options={"include_usage": True},
            )
        )  # fmt: skip
        streamed = ["", ""]
        for c in chunks:
            for choice in c.choices:
                streamed[choice.index] += choice.text
        assert streamed == texts
        assert chunks[-1].usage.completion_tokens == 16

        messages = [{"role": "user", "content": "Name a colour."}]
        parts = list(
            client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=5, temperature=0, n=2, stream=True
            )
        )
        roles = {p.choices[0].index for p in parts if p.choices and p.choices[0].delta.role}
        assert roles == {0, 1}
        said = ["", ""]
        for p in parts:
            for choice in p.choices:
                said[choice.index] += choice.delta.content or ""
        assert said[0] == said[1]
        text = httpx.get(f"{s.url}/metrics", timeout=10).text
        done = [x for x in text.splitlines() if x.startswith("nanoserve:request_success_total")]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in done) == 4  # requests, not samples
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["forks"] >= 2 + 1 + 1 + 1
