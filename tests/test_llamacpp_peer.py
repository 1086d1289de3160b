"""llama.cpp as a benchmark peer, without llama.cpp: its build, conversion and server
commands are checked as data (never run), and the one HTTP client is checked against a
stand-in server on 127.0.0.1 that streams as llama-server's `/completion` and nanoserve's
`/v1/completions` do. No timing is asserted: only that every time is stamped."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from experiments.bench import benchmark, llamacpp
from experiments.bench.http_client import LLAMACPP, NANOSERVE, serve_http
from experiments.bench.http_peers import (
    LLAMA,
    SERVE,
    SERVE_THREAD,
    HttpPeers,
    agreement,
    expand,
    serve_command,
    server_lines,
)
from experiments.bench.peers import Served
from experiments.bench.rows import make_row
from framework.core.request import RequestSpec, SamplingParams


def answer(i: int, n: int) -> list[int]:
    """The stand-in's greedy tokens: request-dependent, so a mix-up shows."""
    return [100 + i * 10 + k for k in range(n)]


class StandIn(BaseHTTPRequestHandler):
    """llama-server's `/health` and streamed `/completion` (token ids with `return_tokens`),
    and nanoserve's streamed `/v1/completions` (text, then the usage chunk). Each request's
    tokens follow from its prompt's first id."""

    bodies: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def _event(self, body: dict[str, Any] | str) -> None:
        data = body if isinstance(body, str) else json.dumps(body)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.bodies.append({"path": self.path, **body})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        i = body["prompt"][0]
        if self.path == "/completion":
            ids = answer(i, body["n_predict"])
            held = ids[-1:] if i == 8 else []  # as llama-server holds a mid-character token
            for t in ids[: len(ids) - len(held)]:
                self._event({"content": f"<{t}>", "tokens": [t], "stop": False})
            final = {"content": "", "tokens": [], "stop": True, "tokens_predicted": len(ids)}
            self._event(final)
        else:
            n = body["max_tokens"] - (1 if i == 9 else 0)  # prompt 9: one token short
            for k, t in enumerate(answer(i, n)):
                finish = "length" if k == n - 1 else None
                self._event({"choices": [{"index": 0, "text": f"<{t}>", "finish_reason": finish}]})
            self._event({"choices": [], "usage": {"completion_tokens": n}})
            self._event("[DONE]")


@pytest.fixture
def stand_in() -> Iterator[str]:
    StandIn.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def specs(lengths: list[int]) -> list[RequestSpec]:
    return [
        RequestSpec(f"r{i}", [i, 7, 8], SamplingParams(max_tokens=n, ignore_eos=True))
        for i, n in enumerate(lengths)
    ]


def test_the_build_is_commands_on_the_vendored_source(tmp_path: Path) -> None:
    layout = llamacpp.Layout(tmp_path / "0.3.36")
    fetch = llamacpp.download_command(layout)
    assert "llama-cpp-python==0.3.36" in fetch and ":all:" in fetch and "--no-deps" in fetch
    configure, build = llamacpp.build_commands(layout, jobs=2)
    assert configure[:3] == ["cmake", "-S", str(layout.source)]
    assert str(layout.source).endswith("src/vendor/llama.cpp")
    assert "-DGGML_NATIVE=ON" in configure and "-DLLAMA_CURL=OFF" in configure
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in configure  # nothing downloaded while building
    assert build[-4:] == ["llama-server", "llama-quantize", "-j", "2"]
    source = tmp_path / "model.Q4_1.gguf"
    q = llamacpp.quantize_command(layout, source, "BF16", 2)
    assert q[1:] == ["--allow-requantize", str(source), str(layout.gguf("BF16")), "BF16", "2"]
    assert q[0] == str(layout.binary("llama-quantize"))


def test_the_server_gets_the_slots_threads_and_room_of_the_run(tmp_path: Path) -> None:
    layout = llamacpp.Layout(tmp_path)
    ctx = llamacpp.context_size(16, 300)
    assert ctx == 16 * 512 and llamacpp.context_size(4, 600) == 4 * 768
    cmd = llamacpp.server_command(layout, tmp_path / "m.gguf", 8123, 16, 2, ctx)
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert cmd[0] == str(layout.binary("llama-server"))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert (flags["-np"], flags["-t"], flags["-tb"], flags["-c"]) == ("16", "2", "2", "8192")
    assert flags["--cache-ram"] == "0"  # no prompt cache carried from one round to the next
    assert "-ctk" not in cmd  # llama.cpp's default KV cache, unless asked
    bf16 = llamacpp.server_command(layout, tmp_path / "m.gguf", 8123, 16, 2, ctx, "bf16")
    assert bf16[-4:] == ["-ctk", "bf16", "-ctv", "bf16"]
    assert llamacpp.KV_TYPES == {"F32": "f32", "BF16": "bf16"}  # the weights' dtype


def test_serve_py_is_started_with_the_reference_policies_and_threads(tmp_path: Path) -> None:
    cmd = serve_command(["dtype=bfloat16", "engine.max_num_seqs=16"], 8124, 2, tmp_path)
    assert cmd[1] == "serve.py" and "dtype=bfloat16" in cmd and "engine.max_num_seqs=16" in cmd
    assert {"scheduler=continuous", "allocator=incremental", "output=immediate"} <= set(cmd)
    assert {"threads=2", "server.port=8124", "server.host=127.0.0.1", "observers=[]"} <= set(cmd)
    assert "server.engine=process" in cmd  # serve.py's default: the engine's own process
    thread = serve_command(["dtype=bfloat16"], 8124, 2, tmp_path, "thread")
    assert "server.engine=thread" in thread


def test_a_build_is_never_run_in_ci_and_a_cached_one_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = llamacpp.Layout(tmp_path / "cache")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="not built in CI"):
        llamacpp.ensure_built(layout, echo=False)
    for name in llamacpp.TARGETS:  # a cached build: found, nothing run
        layout.binary(name).parent.mkdir(parents=True, exist_ok=True)
        layout.binary(name).write_text("")
    assert llamacpp.ensure_built(layout, echo=False) is layout
    monkeypatch.setenv("NANOSERVE_LLAMACPP_CACHE", str(tmp_path / "elsewhere"))
    assert llamacpp.cache_dir("9.9") == tmp_path / "elsewhere" / "9.9"


def test_llamacpp_is_a_peer_only_on_request() -> None:
    assert LLAMA not in benchmark.parse([]).peers
    assert expand(["hf_cb", LLAMA]) == ["hf_cb", SERVE, LLAMA, "llamacpp_q8_0"]
    # nanoserve's server alone, both ways, without llama.cpp; named twice, served once
    both = [SERVE, SERVE_THREAD, LLAMA]
    assert benchmark.parse(["--peers", ",".join(both)]).peers == both
    assert expand(both) == [SERVE, SERVE_THREAD, LLAMA, "llamacpp_q8_0"]


def test_the_client_reads_llama_servers_token_ids(stand_in: str) -> None:
    work = specs([3, 5])
    served = serve_http(stand_in, LLAMACPP, work, timeout_s=30)
    assert served.outputs == {"r0": answer(0, 3), "r1": answer(1, 5)}
    assert served.texts["r0"] == "<100><101><102>"
    assert set(served.first) == set(served.finish) == {"r0", "r1"}
    assert all(served.first[k] <= served.finish[k] <= served.wall_s for k in served.first)
    assert served.note == ""
    # r0's (the requests go at once, in any order): token ids, exact length, greedy, EOS
    # off, no prompt cache
    body = next(b for b in StandIn.bodies if b["prompt"][0] == 0)
    assert body["path"] == "/completion" and body["prompt"] == [0, 7, 8]
    assert body["n_predict"] == 3 and body["temperature"] == 0.0 and body["ignore_eos"] is True
    assert body["cache_prompt"] is False and body["return_tokens"] is True


def test_a_last_token_held_back_is_counted_and_named(stand_in: str) -> None:
    work = [RequestSpec("r8", [8], SamplingParams(max_tokens=3, ignore_eos=True))]
    served = serve_http(stand_in, LLAMACPP, work, timeout_s=30)
    assert served.outputs == {"r8": answer(8, 3)[:2]} and served.counts == {"r8": 3}
    assert served.note == "1 last tokens' ids not streamed"
    ref = Served({"r8": answer(8, 3)}, {"r8": 0.0})
    assert agreement(work, served, ref, str)[0]  # every id it sent agrees
    row = make_row(LLAMA, None, "w", work, (True, 0, ""), served, timed_anyway=True)
    assert row["tpot_p50"] == pytest.approx((served.finish["r8"] - served.first["r8"]) / 2)


def test_the_client_reads_nanoservers_text_and_counts(stand_in: str) -> None:
    work = [*specs([2]), RequestSpec("r9", [9], SamplingParams(max_tokens=4, ignore_eos=True))]
    served = serve_http(stand_in, NANOSERVE, work, timeout_s=30)
    assert served.outputs == {}  # an OpenAI stream carries text only
    assert served.texts == {"r0": "<100><101>", "r9": "<190><191><192>"}
    assert "r9 3/4" in served.note  # the usage chunk's count, against the length asked
    body = next(b for b in StandIn.bodies if b["prompt"] == [0, 7, 8])  # r0's, sent at once
    assert body["path"] == "/v1/completions" and body["max_tokens"] == 2
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}


def test_a_disagreeing_peer_keeps_its_times_and_says_how_much_agrees() -> None:
    work = specs([3, 3])
    ref = Served({"r0": [1, 2, 3], "r1": [4, 5, 6]}, {"r0": 0.0, "r1": 0.0})
    ours = Served(
        {"r0": [1, 2, 3], "r1": [4, 9, 6]},
        {"r0": 0.0, "r1": 0.0},
        {"r0": 0.1, "r1": 0.1},
        {"r0": 0.3, "r1": 0.5},
        wall_s=0.5,
    )
    equal, note = agreement(work, ours, ref, str)
    assert not equal and "1/2 requests, 4/6 tokens (by token ids)" in note
    row = make_row(LLAMA, None, "chat48", work, (equal, 0, note), ours, timed_anyway=True)
    assert row["outputs_equal"] is False and row["tokens_per_s"] and row["tpot_p50"]
    text = Served({}, {"r0": 0.0}, texts={"r0": "[1, 2, 3]"})
    assert agreement(work[:1], text, ref, str) == (
        True,
        "agrees with the reference: 1/1 requests, 3/3 tokens (by text)",
    )
    row["ratio_vs_llamacpp"] = 1.0
    assert any("llama.cpp llama-server (HTTP)" in line for line in server_lines([row]))


def test_peers_warm_once_per_workload_then_time(stand_in: str, tmp_path: Path) -> None:
    with HttpPeers([], 2, 1, "float32", tmp_path, "smollm2") as peers:
        peers.urls[LLAMA] = stand_in  # started: no build, no subprocess
        work = specs([2, 2])
        first = peers.serve(LLAMA, work)
        peers.serve(LLAMA, work)
    assert len(StandIn.bodies) == 3 * len(work)  # one untimed pass, then two timed
    assert first.outputs["r1"] == answer(1, 2) and "/completion" in first.note
    with HttpPeers([], 2, 1, "float32", tmp_path, "tiny") as peers, pytest.raises(ValueError):
        peers.serve(LLAMA, work)  # SmolLM2's GGUF against another model: refused, not timed


# A stand-in llama-server as a process of its own: /health, and one token per request.
PROCESS = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.end_headers()
        self.wfile.write(b'data: {"content": "a", "tokens": [5], "stop": true}\\n\\n')
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_server_runs_until_healthy_and_stops_with_its_pass(tmp_path: Path) -> None:
    port = llamacpp.free_port()
    cmd = [sys.executable, "-c", PROCESS, str(port)]
    with llamacpp.serving(cmd, port, tmp_path / "standin.log", timeout_s=60) as url:
        assert serve_http(url, LLAMACPP, specs([1]), timeout_s=30).outputs == {"r0": [5]}
        proc_alive = llamacpp.httpx.get(f"{url}/health", timeout=5).status_code
    assert proc_alive == 200
    with pytest.raises(llamacpp.httpx.ConnectError):  # stopped with the pass
        llamacpp.httpx.get(f"{url}/health", timeout=5)
    with pytest.raises(RuntimeError, match="exited"):  # a server that dies is reported
        bad = [sys.executable, "-c", "raise SystemExit(3)"]
        with llamacpp.serving(bad, llamacpp.free_port(), tmp_path / "bad.log", timeout_s=30):
            pass
