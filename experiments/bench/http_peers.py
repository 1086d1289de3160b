"""The benchmark's servers: nanoserve through `serve.py` and llama.cpp through
`llama-server`, both driven by the one HTTP client (`http_client.py`), beside nanoserve's
in-process run (`run.py`'s path) in the same rounds.

`--peers llamacpp` adds three systems to each workload's rounds:

- `nanoserve_http`: `python serve.py` in a subprocess, the run's overrides and the reference
  policies, `engine.max_num_seqs` slots, the benchmark's threads;
- `llamacpp`: llama-server on the GGUF of the pass's dtype (F32 for fp32, BF16 for bf16),
  with the same slots and threads;
- `llamacpp_q8_0`: the same server on Q8_0 weights, llama.cpp's own quantized speed (in the
  first dtype's pass only: it is the same server in every dtype).

The servers start on first use (outside any clock), see each workload once untimed (first
shapes, as the in-process runs are warmed) and stop when the dtype's pass ends. llama.cpp's
kernels are not nanoserve's, so its greedy tokens may part from the reference where two
logits are close: its rows report how many requests and tokens agree instead of dropping
its times (`agreement`).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from experiments.bench import llamacpp
from experiments.bench.http_client import LLAMACPP, NANOSERVE, Dialect, serve_http
from experiments.bench.peers import Served
from experiments.toolkit.config import REFERENCE, combo_overrides
from framework.core.request import RequestSpec
from framework.run.paths import ROOT

SERVE = "nanoserve_http"
SERVE_THREAD = "nanoserve_http_thread"  # serve.py with its engine in a thread of its process
LLAMA = "llamacpp"
EXTRA = {"llamacpp_q8_0": "Q8_0"}  # llama.cpp's own quantized weights, for scale
SERVERS = {SERVE: "process", SERVE_THREAD: "thread"}  # nanoserve's, by `server.engine`
HTTP_SYSTEMS = (SERVE, SERVE_THREAD, LLAMA, *EXTRA)


def expand(peers: list[str], first_pass: bool = True) -> list[str]:
    """The systems behind `--peers`: `llamacpp` brings nanoserve's server and the extras;
    `nanoserve_http` and `nanoserve_http_thread` are nanoserve's server alone, its engine in
    a process of its own or in a thread of the server's (no llama.cpp build needed)."""
    out: list[str] = []
    for p in peers:
        if p == LLAMA:
            out += [SERVE, LLAMA, *(EXTRA if first_pass else ())]
        else:
            out.append(p)
    return list(dict.fromkeys(out))


def serve_command(
    overrides: list[str], port: int, threads: int, run_dir: Path, engine: str = "process"
) -> list[str]:
    """`serve.py` as the benchmark starts it: the pass's overrides (model, dtype, slots),
    the reference policies, no observers (the in-process runs have none either), its engine
    where `engine` says (`server.engine`)."""
    return [
        sys.executable, "serve.py", *combo_overrides(overrides, REFERENCE), "observers=[]",
        f"threads={threads}", "server.host=127.0.0.1", f"server.port={port}",
        "server.max_waiting=null", f"server.engine={engine}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip


def agreement(
    specs: list[RequestSpec], served: Served, ref: Served, decode: Any
) -> tuple[bool, str]:
    """(all equal, a note): requests and tokens equal to the reference's, by token id where
    the server sent ids, else by text (the reference's ids decoded as the server decodes
    them). A token-level count is the length of the common prefix."""
    same = tokens = 0
    total = sum(s.sampling.max_tokens for s in specs)
    for s in specs:
        want = ref.outputs[s.id]
        if s.id in served.outputs:
            got = served.outputs[s.id]  # (its last ids may be missing: see `http_client`)
            prefix = next(
                (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None
            )
            n = min(len(got), len(want)) if prefix is None else prefix
            same += bool(got) and got == want[: len(got)]
            tokens += n
        else:
            equal = served.texts.get(s.id) == decode(want)
            same += equal
            tokens += len(want) if equal else 0
    by = "token ids" if any(s.id in served.outputs for s in specs) else "text"
    note = f"agrees with the reference: {same}/{len(specs)} requests, {tokens}/{total} tokens"
    return same == len(specs), f"{note} (by {by})"


class HttpPeers:
    """The servers of one dtype's pass, started on first use and stopped on exit."""

    def __init__(
        self, overrides: list[str], slots: int, threads: int, dtype: str, out: Path, model: str
    ) -> None:
        self.overrides, self.slots, self.threads, self.dtype = overrides, slots, threads, dtype
        self.out, self.model = out, model
        self.stack = contextlib.ExitStack()
        self.urls: dict[str, str] = {}
        self.seen: set[tuple[str, int]] = set()

    def __enter__(self) -> HttpPeers:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stack.close()

    def _start(self, system: str, longest: int) -> str:
        log_dir = self.out / "servers"
        if system in SERVERS:
            port = llamacpp.free_port()
            name = f"serve-{SERVERS[system]}-{self.dtype}"
            cmd = serve_command(self.overrides, port, self.threads, log_dir / name, SERVERS[system])
            log = log_dir / f"{name}.log"
            return self.stack.enter_context(llamacpp.serving(cmd, port, log, cwd=ROOT))
        if self.model != "smollm2":  # its GGUF is SmolLM2's: another model would time nothing
            raise ValueError(f"llama.cpp serves SmolLM2's GGUF only, not model={self.model}")
        kind = EXTRA.get(system) or llamacpp.GGUF_TYPES.get(self.dtype)
        if kind is None:
            raise ValueError(f"llama.cpp has no GGUF type for {self.dtype}")
        server = llamacpp.llama_server(kind, self.slots, self.threads, longest, log_dir)
        return self.stack.enter_context(server)

    def serve(self, system: str, specs: list[RequestSpec]) -> Served:
        """One timed pass of `specs` through `system`, after an untimed one the first time
        this server sees these requests."""
        longest = max(len(s.prompt_token_ids) + s.sampling.max_tokens for s in specs)
        if system not in self.urls:
            self.urls[system] = self._start(system, longest)
        dialect: Dialect = NANOSERVE if system in SERVERS else LLAMACPP
        key = (system, hash(tuple((s.id, s.arrival, s.sampling.max_tokens) for s in specs)))
        if key not in self.seen:
            self.seen.add(key)
            serve_http(self.urls[system], dialect, specs)
        served = serve_http(self.urls[system], dialect, specs)
        served.note = "; ".join(n for n in (served.note, f"HTTP client, {dialect.path}") if n)
        return served


LABELS = {
    SERVE: "nanoserve, serve.py (HTTP)",
    SERVE_THREAD: "nanoserve, serve.py, engine in a thread (HTTP)",
    LLAMA: "llama.cpp llama-server (HTTP)",
}
LABELS |= {name: f"llama.cpp llama-server, {kind} (HTTP)" for name, kind in EXTRA.items()}


def server_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The servers side by side with nanoserve's in-process run, per workload: tokens/s,
    TTFT and TPOT (p50), each over llama.cpp's tokens/s in the same dtype, and whether the
    tokens agree. Empty when no server ran."""
    if not any(r["system"] in HTTP_SYSTEMS for r in rows):
        return []
    lines = [
        "| workload | system | tokens/s | TTFT p50 s | TPOT p50 s | vs in process | vs llama.cpp "
        "| note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        ref = [r for r in mine if r["system"] == "nanoserve"][:1]  # the reference, first
        base = ref[0]["tokens_per_s"] if ref else None
        for r in ref + [r for r in mine if r["system"] in HTTP_SYSTEMS]:
            name = LABELS.get(r["system"], "nanoserve, in process (run.py's path)")
            ratio = r.get(f"ratio_vs_{LLAMA}")
            own = r["tokens_per_s"] / base if base and r["tokens_per_s"] else None
            cells = [r["tokens_per_s"], r["ttft_p50"], r["tpot_p50"]]
            shown = ["" if v is None else f"{v:.4g}" for v in cells]
            shown += ["" if x is None else f"{x:.3g}x" for x in (own, ratio)]
            lines.append(f"| {workload} | {name} | {' | '.join(shown)} | {r['note']} |")
    return lines
