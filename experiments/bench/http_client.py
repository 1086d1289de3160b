"""One async HTTP client for every server the benchmark drives (nanoserve's `serve.py`,
llama.cpp's `llama-server`): the same requests, sent the same way, timed by the same clock.

Each request goes as its prompt's token ids with its exact output length, greedy, EOS
ignored, streamed: neither server tokenizes a prompt nor stops early, so both compute the
same number of tokens for the same inputs. What differs between the servers is data, not
code: a `Dialect` names the endpoint, the body's extra fields and how a streamed chunk
carries its text, its token ids (where the server sends them) and its end.

Times are the client's, in seconds since the first request was sent: a request's arrival
is when it was sent (its `RequestSpec.arrival` after t0, as the open loop asks), its first
token when the first chunk with text or tokens came, its last when its final chunk came.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from experiments.bench.peers import Served
from framework.core.request import RequestSpec


@dataclass(frozen=True)
class Piece:
    """What one streamed chunk says: new text, new token ids (None: the server does not
    send them), and whether the request has ended."""

    text: str = ""
    tokens: list[int] | None = None
    done: bool = False
    count: int | None = None  # tokens generated so far, where the server reports it


@dataclass(frozen=True)
class Dialect:
    """How one server is asked and how its stream is read."""

    name: str
    path: str
    body: Callable[[RequestSpec], dict[str, Any]]
    parse: Callable[[dict[str, Any]], Piece]


def openai_body(spec: RequestSpec) -> dict[str, Any]:
    """OpenAI's completions with vLLM's `ignore_eos`, as nanoserve's server accepts them;
    the usage chunk at the end counts the tokens the server generated."""
    return {
        "prompt": list(spec.prompt_token_ids),
        "max_tokens": spec.sampling.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def openai_piece(chunk: dict[str, Any]) -> Piece:
    choices = chunk.get("choices") or []
    usage = chunk.get("usage") or {}
    count = usage.get("completion_tokens")
    if not choices:  # the usage chunk, last
        return Piece(done=False, count=count)
    c = choices[0]
    return Piece(text=c.get("text") or "", done=c.get("finish_reason") is not None, count=count)


def llamacpp_body(spec: RequestSpec) -> dict[str, Any]:
    """llama-server's own `/completion`: the only endpoint that streams token ids
    (`return_tokens`); `cache_prompt: false` so that no slot reuses an earlier round's KV
    (nanoserve keeps none between requests either)."""
    return {
        "prompt": list(spec.prompt_token_ids),
        "n_predict": spec.sampling.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "cache_prompt": False,
        "return_tokens": True,
    }


def llamacpp_piece(chunk: dict[str, Any]) -> Piece:
    return Piece(
        text=chunk.get("content") or "",
        tokens=[int(t) for t in chunk.get("tokens") or []],
        done=bool(chunk.get("stop")),
        count=chunk.get("tokens_predicted") if chunk.get("stop") else None,
    )


NANOSERVE = Dialect("nanoserve", "/v1/completions", openai_body, openai_piece)
LLAMACPP = Dialect("llamacpp", "/completion", llamacpp_body, llamacpp_piece)


@dataclass
class _Got:
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    has_ids: bool = False
    count: int | None = None
    first: float | None = None
    finish: float | None = None


def events(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON bodies of server-sent events (`data: {...}`), `[DONE]` and blanks skipped."""
    out = []
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                out.append(json.loads(data))
    return out


async def _one(
    client: httpx.AsyncClient, url: str, dialect: Dialect, spec: RequestSpec, t0: float
) -> _Got:
    wait = spec.arrival - (time.perf_counter() - t0)
    if wait > 0:
        await asyncio.sleep(wait)
    got = _Got()
    async with client.stream("POST", url + dialect.path, json=dialect.body(spec)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{spec.id}: HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            for chunk in events([line]):
                if "error" in chunk:
                    raise RuntimeError(f"{spec.id}: {chunk['error']}")
                now = time.perf_counter() - t0
                p = dialect.parse(chunk)
                if p.text or p.tokens:
                    got.first = now if got.first is None else got.first
                    got.text.append(p.text)
                if p.tokens is not None:
                    got.has_ids = True
                    got.tokens += p.tokens
                if p.count is not None:
                    got.count = p.count
                if p.done and got.finish is None:
                    got.finish = now
    return got


async def serve_async(
    url: str, dialect: Dialect, specs: list[RequestSpec], timeout_s: float = 3600.0
) -> Served:
    """Every request at its arrival, all streams open at once (one connection each)."""
    limits = httpx.Limits(max_connections=len(specs) + 1, max_keepalive_connections=0)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(_one(client, url, dialect, s, t0) for s in specs))
    return record(specs, list(got), dialect.name)


def record(specs: list[RequestSpec], got: list[_Got], name: str) -> Served:
    """The client's stamps as the benchmark's `Served`. Token ids where the server sent
    them; else (nanoserve's OpenAI stream carries text) the text in `texts`. A request whose
    token count is not its `max_tokens` is named in the note."""
    served = Served({}, {s.id: s.arrival for s in specs})
    short, unsent = [], 0
    for s, g in zip(specs, got, strict=True):
        if g.has_ids:
            served.outputs[s.id] = g.tokens
        served.texts[s.id] = "".join(g.text)
        n = g.count if g.count is not None else (len(g.tokens) if g.has_ids else None)
        if n is not None:
            served.counts[s.id] = n
            # llama-server holds back a token whose text ends mid-character, and its stream's
            # last chunk carries no ids: such a last token is counted, its id never seen.
            unsent += n - len(g.tokens) if g.has_ids else 0
        if n is not None and n != s.sampling.max_tokens:
            short.append(f"{s.id} {n}/{s.sampling.max_tokens}")
        if g.first is not None:
            served.first[s.id] = g.first
        if g.finish is not None:
            served.finish[s.id] = g.finish
    notes = [f"{name}: tokens not as asked: {', '.join(short[:5])}" if short else ""]
    notes.append(f"{unsent} last tokens' ids not streamed" if unsent else "")
    served.note = "; ".join(n for n in notes if n)
    served.wall_s = max(served.finish.values(), default=0.0)
    return served


def serve_http(
    url: str, dialect: Dialect, specs: list[RequestSpec], timeout_s: float = 3600.0
) -> Served:
    """`serve_async` from synchronous code (the benchmark's loop)."""
    return asyncio.run(serve_async(url, dialect, specs, timeout_s))
