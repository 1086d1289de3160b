"""The server saturated, bounded: its capacity measured on the tiny model, then about twice
that offered for a few seconds by many concurrent streams (the official `openai` client),
a fifth of those it accepts closing their stream mid-way, under a small
`server.max_waiting` so that 429s come. `experiments/bench/server_soak.py`'s driver and
checks, on a server in this process on 127.0.0.1 (tests/test_server.py's `served`). Counts
are asserted, never timings."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from experiments.bench.server_soak import ENDED, Shape, checks, server_rows, soak
from tests.test_server import FIXED, loaded, served

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_WAITING = 4
MAX_TOKENS = 16
# Four rows and a pool of 16 blocks of 4 slots: a request needs up to 7, so the rows outgrow
# the pool and some are preempted; a client may then leave while its request waits again.
TIGHT = ["engine.max_num_seqs=4", "engine.block_size=4", "engine.num_blocks=16"]


def test_saturated_server_keeps_its_books_and_its_pool(tiny, tmp_path) -> None:
    with served(
        tmp_path, *FIXED, *TIGHT, f"server.max_waiting={MAX_WAITING}",
        loaded=loaded(tiny),
    ) as s:  # fmt: skip
        result = asyncio.run(
            soak(
                s.url, Shape("tiny", MAX_TOKENS), streams=6, capacity_s=2.0, seconds=4.0,
                overload=2.0, share=0.2, limit=400, settle_s=30.0,
            )
        )  # fmt: skip
        assert result.settled, result.metrics
        assert s.running.loop.engine.pool.num_used == 0  # the pool whole, as the engine sees it
    rows = server_rows(tmp_path)
    outcomes = result.outcomes
    kinds = Counter(o.kind for o in outcomes)
    # Each client finished, left mid-stream, or was refused with 429; each happened.
    assert set(kinds) <= set(ENDED), [o.detail for o in outcomes if o.kind not in ENDED][:3]
    assert all(kinds[k] > 0 for k in ENDED), kinds
    accepted = [o for o in outcomes if o.kind in ("finished", "disconnected")]
    # The server's records: every accepted request exactly once, finished or aborted, and
    # nothing it took that no client asked for.
    reason = {r["id"]: r["finish_reason"] for r in rows}
    assert len(reason) == len(rows) == len(accepted)
    assert sorted(reason) == sorted(o.id for o in accepted)
    for o in accepted:
        if o.kind == "finished":
            assert reason[o.id] == "length" and o.tokens == MAX_TOKENS
        else:  # aborted, or (left after its last token) finished before the client left
            assert reason[o.id] in ("abort", "length")
    aborted = sum(r == "abort" for r in reason.values())
    assert aborted > 0
    # /metrics once idle: accepted = success + aborted, and the clients' own counts.
    m = result.metrics
    assert m["request_accepted_total"] == len(accepted)
    assert m["request_success_total"] + m["request_aborted_total"] == len(accepted)
    assert m["request_aborted_total"] == aborted
    assert m["request_refused_total{status=429}"] == kinds["refused"]
    assert m["kv_cache_blocks_used"] == 0 < m["kv_cache_blocks_total"]
    # The 429s came only once the queue held `server.max_waiting`, by their own count.
    refused = sorted((o for o in outcomes if o.kind == "refused"), key=lambda o: o.done)
    assert refused[0].waiting is not None and refused[0].waiting >= MAX_WAITING
    assert all(o.waiting is not None and o.waiting >= MAX_WAITING for o in refused)
    # ... and the server answered an ordinary request after the load.
    after = [o for o in outcomes if o.phase == "after"]
    assert [(o.kind, o.tokens) for o in after] == [("finished", MAX_TOKENS)]
    # The tool's own checks agree; the engine's books closed at the stop (`Engine.finish`).
    verdicts = checks(result, rows, MAX_WAITING)
    assert all(v["ok"] for v in verdicts), verdicts
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["aborted"] == aborted and metrics["incomplete"] is False
