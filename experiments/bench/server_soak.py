"""A saturation soak of the HTTP server: overload, clients that give up mid-stream, and the
books checked whole afterwards.

    python -m experiments.server_soak                           # the tiny model, 30 s
    python -m experiments.server_soak --seconds 60 --overload 3 engine.max_num_seqs=8

`serve.py` starts on a free port of 127.0.0.1 (by default the tiny model, its pool small
enough that requests are preempted: `DEFAULTS`, which overrides change). Its capacity is
measured first: completed requests/s under a closed loop of `--concurrency` streams (the
official `openai` client, AsyncOpenAI). Then an open loop offers `--overload` x that rate
(Poisson arrivals) for `--seconds`, every request a stream of `--max-tokens` tokens
(`ignore_eos`); a share of the streams it accepts (`--disconnect-share`: every 1/share-th)
close after a few tokens. Last, one ordinary request. A saturated server must refuse (429)
rather than queue without end, and a client that goes away must cost nothing once gone; so,
with the server idle again:

- outcomes: every client finished, disconnected or was refused (429), nothing else;
- books: every accepted request is in the server's records (requests.csv) exactly once,
  finished or aborted, and no record lacks its client;
- counters: /metrics' accepted = success + aborted, and they equal the clients' counts;
- pool: no KV block is held;
- queue bound: 429s came, and each said at least `server.max_waiting` requests waited;
- serving: the ordinary request after the load finished.

Writes `soak.md` and `soak.json` into `--out` (the server's run folder in `server/`); exits 1
if a check fails. Counts hold on any machine; seconds describe this one (the report names its
CPU). `tests/test_server_soak.py` runs the same driver and checks, bounded, in-process.
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import re
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai

from experiments.toolkit.cli import add_out, add_overrides, parser, positive_int
from framework.run.paths import ROOT
from framework.tracking.tool_run import command_line

# The driver's defaults, before the user's overrides (the last value wins): the tiny model
# (capacity in seconds, not minutes), one torch thread (server and clients share the cores),
# a queue bound the overload reaches within seconds, and a pool the rows outgrow, so that
# requests are preempted and some clients leave while theirs waits to run again.
DEFAULTS = [
    "model=tiny", "threads=1", "observers=[]", "server.max_waiting=32",
    "engine.block_size=4", "engine.num_blocks=96",
]  # fmt: skip
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "Water boils at",
]
ENDED = ("finished", "disconnected", "refused")  # a client's outcomes; anything else: "error"


@dataclass
class Outcome:
    """One client's request as the client saw it (seconds on its own perf_counter)."""

    phase: str
    kind: str = "error"
    sent: float = 0.0
    done: float = 0.0
    id: str | None = None
    ttft: float | None = None
    tokens: int = 0  # finished: usage's completion tokens; disconnected: chunks read
    finish: str | None = None
    waiting: int | None = None  # a 429's count of waiting requests
    detail: str = ""


@dataclass
class Shape:
    """What every request asks for, and how a leaving client leaves."""

    model: str
    max_tokens: int = 32
    leave_after: tuple[int, int] = (1, 3)  # chunks read before closing, at least / at most


@dataclass
class Soak:
    """What a soak measured, before the server stopped."""

    capacity: float  # completed requests/s under the closed loop
    target: float  # the open loop's mean rate
    offered: float  # the rate it sent at, as sent
    outcomes: list[Outcome]
    metrics: dict[str, float]  # the last scrape, once the server was idle
    settled: bool
    peak_waiting: float = 0.0


def waiting_in(message: str) -> int | None:
    """The waiting count a 429 names ('N requests are waiting, the bound ... is M')."""
    found = re.search(r"(\d+) requests are waiting", message)
    return int(found.group(1)) if found else None


@dataclass
class Leavers:
    """Which clients give up: every `1 / share`-th stream the server accepts, the first of
    them included, each after a few chunks (`Shape.leave_after`). Chosen among the accepted
    streams, not among the requests sent: a loaded server refuses most of an overload, and
    a leaver drawn among the refused never leaves."""

    share: float
    leave_after: tuple[int, int]
    rng: random.Random
    opened: int = 0

    def decide(self) -> int | None:
        """Whether the stream just accepted leaves, and after how many chunks."""
        self.opened += 1
        every = round(1 / self.share) if self.share > 0 else 0
        if not every or (self.opened - 1) % every:
            return None
        return self.rng.randint(*self.leave_after)


async def one(
    client: openai.AsyncOpenAI, shape: Shape, prompt: str, leavers: Leavers | None, phase: str
) -> Outcome:
    """One streamed request; a client `leavers` picks closes the stream after a few chunks,
    as a user who gives up does."""
    out = Outcome(phase, sent=time.perf_counter())
    try:
        stream = await client.completions.create(
            model=shape.model, prompt=prompt, max_tokens=shape.max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        leave_after = leavers.decide() if leavers is not None else None  # it was accepted
        chunks = 0
        async for c in stream:
            out.id = c.id
            if c.choices:
                chunks += 1
                if out.ttft is None:
                    out.ttft = time.perf_counter() - out.sent
                out.finish = c.choices[0].finish_reason or out.finish
            if c.usage is not None:
                out.tokens = c.usage.completion_tokens
            if leave_after is not None and chunks >= leave_after and out.finish is None:
                await stream.close()
                out.kind, out.tokens = "disconnected", chunks
                break
        else:
            out.kind = "finished" if out.finish is not None else "error"
            out.detail = "" if out.finish is not None else "the stream ended without a finish"
    except openai.RateLimitError as error:
        out.kind, out.waiting = "refused", waiting_in(error.message)
    except Exception as error:  # any other end is a finding: recorded, not raised
        out.detail = f"{type(error).__name__}: {error}"[:300]
    out.done = time.perf_counter()
    return out


async def closed_loop(
    client: openai.AsyncOpenAI, shape: Shape, streams: int, seconds: float
) -> tuple[float, list[Outcome]]:
    """Completed requests/s with `streams` clients each sending its next request when its
    last one ends, counted from the first completion (the batch full) to the end."""
    outcomes: list[Outcome] = []
    stop_at = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        while time.perf_counter() < stop_at:
            o = await one(
                client, shape, PROMPTS[(i + len(outcomes)) % len(PROMPTS)], None, "capacity"
            )
            outcomes.append(o)
            if o.kind == "error":
                return
            if o.kind == "refused":  # the closed loop met the bound: a moment, then again
                await asyncio.sleep(0.05)

    await asyncio.gather(*(worker(i) for i in range(streams)))
    ends = sorted(o.done for o in outcomes if o.kind == "finished" and o.done <= stop_at)
    if len(ends) < 2:
        raise SystemExit(f"capacity: {len(ends)} requests finished in {seconds:g} s; give more")
    return (len(ends) - 1) / (ends[-1] - ends[0]), outcomes


async def open_loop(
    client: openai.AsyncOpenAI, shape: Shape, rate: float, seconds: float, share: float,
    limit: int, rng: random.Random,
) -> tuple[float, list[Outcome]]:  # fmt: skip
    """Poisson arrivals at `rate` for `seconds` (at most `limit`), each its own stream, none
    waiting for another; a `share` of the accepted clients leave mid-stream. Returns the
    rate it sent at and the outcomes."""
    leavers = Leavers(share, shape.leave_after, rng)
    tasks = []
    t0 = time.perf_counter()
    at = 0.0
    while at < seconds and len(tasks) < limit:
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        prompt = PROMPTS[len(tasks) % len(PROMPTS)]
        tasks.append(asyncio.create_task(one(client, shape, prompt, leavers, "overload")))
        at += rng.expovariate(rate)
    sending = max(time.perf_counter() - t0, 1e-9)
    return len(tasks) / sending, list(await asyncio.gather(*tasks))


def parse_metrics(text: str) -> dict[str, float]:
    """A /metrics scrape by sample name (prefix dropped, summed over labels), and each
    labelled sample under `name{label=value}` (the model's label left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("nanoserve:") or s.name.endswith("_created"):
                continue
            name = s.name.removeprefix("nanoserve:")
            out[name] = out.get(name, 0.0) + s.value
            labels = {k: v for k, v in s.labels.items() if k != "model_name"}
            if labels and "le" not in labels and not name.startswith("server_info"):
                key = name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
                out[key] = s.value
    return out


async def scrape(url: str) -> dict[str, float]:
    """One /metrics scrape (the standard library's client, in a thread: no second HTTP
    stack beside the `openai` client's)."""

    def get() -> str:
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
            return r.read().decode()

    return parse_metrics(await asyncio.to_thread(get))


def idle(m: dict[str, float]) -> bool:
    """Nothing runs or waits, and every request taken in has ended (finished or aborted)."""
    ended = m.get("request_success_total", 0.0) + m.get("request_aborted_total", 0.0)
    quiet = m.get("num_requests_running", 0) == m.get("num_requests_waiting", 0) == 0
    return quiet and m.get("request_accepted_total", 0.0) == ended


async def soak(
    url: str, shape: Shape, *, streams: int, capacity_s: float, seconds: float,
    overload: float, share: float, limit: int, seed: int = 0, settle_s: float = 60.0,
) -> Soak:  # fmt: skip
    """The whole drive against a server at `url`: capacity, overload, one request after,
    and the last scrape once the server is idle (or `settle_s` has passed)."""
    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    capacity, outcomes = await closed_loop(client, shape, streams, capacity_s)
    target = overload * capacity
    peak = [0.0]
    stop = asyncio.Event()

    async def watch() -> None:  # the queue as /metrics shows it while the load runs
        while not stop.is_set():
            try:
                m = await scrape(url)
            except OSError:  # the server gone: the clients' outcomes will say so
                return
            peak[0] = max(peak[0], m.get("num_requests_waiting", 0.0))
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    try:
        offered, load = await open_loop(client, shape, target, seconds, share, limit, rng)
    finally:
        stop.set()
        await watcher
    outcomes += load
    outcomes.append(await one(client, shape, PROMPTS[0], None, "after"))
    deadline = time.perf_counter() + settle_s
    metrics = await scrape(url)
    while not idle(metrics) and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
        metrics = await scrape(url)
    await client.close()
    return Soak(capacity, target, offered, outcomes, metrics, idle(metrics), peak[0])


def server_rows(run_dir: Path) -> list[dict[str, str]]:
    """The server's record of every request it took (its run folder's requests.csv)."""
    with (run_dir / "requests.csv").open() as f:
        return list(csv.DictReader(f))


def checks(s: Soak, rows: list[dict[str, str]], max_waiting: int | None) -> list[dict[str, Any]]:
    """Each check's name, verdict and what it found."""
    kinds = Counter(o.kind for o in s.outcomes)
    errors = [o.detail for o in s.outcomes if o.kind not in ENDED]
    accepted = [o for o in s.outcomes if o.kind in ("finished", "disconnected")]
    taken = {r["id"]: r for r in rows if r["finish_reason"] != "rejected"}
    # Books: request by request, the server's records against the clients'.
    records = Counter(r["id"] for r in rows if r["finish_reason"] != "rejected")
    clients = Counter(o.id for o in accepted)
    twice = [i for i in records | clients if (records[i], clients[i]) != (1, 1)]
    bad, late = [], 0
    for o in (o for o in accepted if o.id in taken):
        row = taken[o.id or ""]
        reason, tokens = row["finish_reason"], int(row["output_tokens"])
        late += o.kind == "disconnected" and reason == "length"  # it ended before they left
        finished = (reason, o.tokens) == ("length", tokens)  # all its tokens, and only those
        if not (finished if o.kind == "finished" else reason in ("abort", "length")):
            bad.append(f"{o.id}: the client {o.kind} ({o.tokens}), the server {reason} ({tokens})")
    aborted = sum(r["finish_reason"] == "abort" for r in taken.values())
    m = s.metrics
    acc, done, ab = (m.get(f"request_{k}_total", 0.0) for k in ("accepted", "success", "aborted"))
    refused = m.get("request_refused_total{status=429}", 0.0)
    sums = s.settled and acc == done + ab == len(taken) and ab == aborted
    used, total = m.get("kv_cache_blocks_used", -1), m.get("kv_cache_blocks_total", 0)
    said = [o for o in s.outcomes if o.kind == "refused"]
    first = min(said, key=lambda o: o.done).waiting if said else None
    low = [o.waiting for o in said if max_waiting is not None and (o.waiting or -1) < max_waiting]
    after = [o.kind for o in s.outcomes if o.phase == "after"]
    found = [
        ("outcomes", not errors and kinds["finished"] > 0 and kinds["disconnected"] > 0,
         f"{dict(kinds)}" + (f"; first error: {errors[0]}" if errors else "")),
        ("books", not twice and not bad,
         f"{len(taken)} records, {len(accepted)} accepted clients; {aborted} aborted, {late} left "
         f"after their last token; not once each: {twice[:5]}; {bad[:3]}"),
        ("counters", sums and acc == len(accepted) and refused == kinds["refused"],
         f"accepted {acc:g} = success {done:g} + aborted {ab:g}; clients: {len(accepted)} "
         f"accepted, {kinds['refused']} refused; 429s counted {refused:g}"),
        ("pool", s.settled and used == 0 and total > 0, f"{used:g} of {total:g} blocks used"),
        ("queue bound", (bool(said) and not low) if max_waiting is not None else not said,
         f"{len(said)} refused, the first when {first} waited; bound {max_waiting}; "
         f"below it: {low[:5]}"),
        ("serving", after == ["finished"], f"a request after the load: {after}"),
    ]  # fmt: skip
    return [{"check": c, "ok": bool(ok), "detail": d} for c, ok, d in found]


def cpu_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it, and its core count."""
    import os
    import platform

    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def figures(s: Soak) -> dict[str, Any]:
    """The soak's measured numbers: rates, the overload's outcomes, its TTFTs (client side,
    finished streams), and the queue as it met the bound."""
    load = [o for o in s.outcomes if o.phase == "overload"]
    kinds = Counter(o.kind for o in load)
    ttft = [o.ttft for o in load if o.kind == "finished" and o.ttft is not None]
    refused = [o for o in s.outcomes if o.kind == "refused"]
    first = min(refused, key=lambda o: o.done) if refused else None

    def ms(q: float) -> float | None:
        return round(float(np.percentile(ttft, q)) * 1000, 1) if ttft else None

    return {
        "capacity_rps": round(s.capacity, 2),
        "target_rps": round(s.target, 2),
        "offered_rps": round(s.offered, 2),
        "sent": len(load),
        **{k: kinds[k] for k in (*ENDED, "error")},
        "aborted": int(s.metrics.get("request_aborted_total", 0)),
        "preemptions": int(s.metrics.get("num_preemptions_total", 0)),
        "ttft_p50_ms": ms(50),
        "ttft_p99_ms": ms(99),
        "first_429_waiting": first.waiting if first else None,
        "peak_waiting_seen": s.peak_waiting,
        "capacity_requests": sum(o.phase == "capacity" for o in s.outcomes),
    }


def report(command: str, facts: dict[str, Any], found: dict[str, Any], verdicts: list) -> str:
    """soak.md: the command and the CPU first, as the figures mean nothing without them."""
    lines = [
        "# Server saturation soak", "", f"`{command}`", "",
        f"CPU: {facts['cpu']}. Each request: {facts['max_tokens']} tokens (`ignore_eos`); "
        f"`server.max_waiting={facts['max_waiting']}`; overrides: {' '.join(facts['overrides'])}",
        "", "| figure | value |", "|---|---|",
        *(f"| {k} | {'' if v is None else v} |" for k, v in found.items()),
        "", "| check | verdict | found |", "|---|---|---|",
        *(f"| {v['check']} | {'ok' if v['ok'] else 'FAILED'} | {v['detail']} |" for v in verdicts),
        "", "Counts hold on any machine; rates and TTFTs (the client's, from sending to the first "
        "chunk, of the overload's finished streams) describe this one.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from experiments.bench.serve_bench import NAME, start_server, stop_server

    """The soak against `serve.py` in its own process (the clients' work not on its GIL)."""
    from framework.run.compose import compose_cfg

    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=30.0, help="the overload's length")
    ap.add_argument("--capacity-seconds", type=float, default=10.0, help="the closed loop's")
    ap.add_argument("--overload", type=float, default=2.0, help="x the measured capacity")
    ap.add_argument("--disconnect-share", type=float, default=0.2, help="clients that leave")
    ap.add_argument("--concurrency", type=positive_int, default=32, help="closed-loop streams")
    ap.add_argument("--max-tokens", type=positive_int, default=32, help="each request's")
    ap.add_argument("--max-requests", type=positive_int, default=20_000, help="the overload's")
    ap.add_argument("--seed", type=int, default=0, help="arrivals and who leaves")
    add_out(ap, ROOT / "outputs" / "server_soak")
    add_overrides(ap, f"Hydra overrides of the served run (after {' '.join(DEFAULTS)})")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*DEFAULTS, *args.overrides]
    max_waiting = compose_cfg(overrides).server.max_waiting
    budget = args.capacity_seconds + args.seconds + 600  # the server stops by itself after it
    proc, port = start_server(out / "server", overrides, budget)
    try:
        s = asyncio.run(
            soak(
                f"http://127.0.0.1:{port}", Shape(NAME, args.max_tokens),
                streams=args.concurrency, capacity_s=args.capacity_seconds,
                seconds=args.seconds, overload=args.overload, share=args.disconnect_share,
                limit=args.max_requests, seed=args.seed,
            )
        )  # fmt: skip
    finally:
        stop_server(proc)
    verdicts = checks(s, server_rows(out / "server"), max_waiting)
    exited = f"serve.py exited {proc.returncode} (0: the engine's books closed at its stop)"
    verdicts.append({"check": "server exit", "ok": proc.returncode == 0, "detail": exited})
    facts = {"cpu": cpu_name(), "max_tokens": args.max_tokens, "max_waiting": max_waiting}
    facts["overrides"] = overrides
    found = figures(s)
    command = command_line("server_soak", argv)
    text = report(command, facts, found, verdicts)
    (out / "soak.md").write_text(text)
    record = {"command": command, **facts, "figures": found, "checks": verdicts}
    record |= {"metrics": s.metrics, "outcomes": [asdict(o) for o in s.outcomes]}
    (out / "soak.json").write_text(json.dumps(record, indent=2) + "\n")
    print(text)
    return 0 if all(v["ok"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
