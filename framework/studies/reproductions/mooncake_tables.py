"""The Markdown sections of the Mooncake reproduction's report beyond its cells: the engine
against the traces' own replay, the capacity curve point by point (what a small capacity
means), and what requests arriving together change. Each reads the series that
`mooncake_cache.trace_series` makes."""

from __future__ import annotations

from typing import Any

from framework.tracking.tables import markdown_table


def replay_section(series: dict[str, dict[str, Any]], target: float) -> str:
    rows = []
    for trace, s in series.items():
        r, engine = s["replay"], s["unbounded"]["hit_rate"]
        gap = engine - r["published_rule"]
        rows.append(
            {
                "trace": trace,
                "replay, paper's counting %": round(r["published_rule"], 3),
                "replay, engine's counting %": round(r["engine_rule"], 3),
                "engine, unbounded %": round(engine, 3),
                "engine - paper's counting, points": round(gap, 3),
                f"within {target:g} points": "yes" if abs(gap) <= target else "no",
                "engine = engine's counting": (
                    "exactly" if s["unbounded"]["hit_tokens"] == r["engine_rule_tokens"] else "no"
                ),
            }
        )
    return (
        "The traces' hash ids replayed with no engine and no capacity limit "
        "(`hash_replay.py`). The paper's counting takes a request's leading blocks seen "
        "before, up to the first unseen one, the last cut to the prompt's length; the "
        "engine's counting takes only full blocks, and never a prompt's last token. The "
        "unbounded engine run is held to the first within the target and must equal the "
        "second token for token: what is left between them and Table 2 is the traces, not "
        "the engine.\n\n" + markdown_table(rows, list(rows[0]))
    )


def curve_section(series: dict[str, dict[str, Any]]) -> str:
    cols = [
        "trace",
        "capacity tokens",
        "pool blocks",
        "hit %",
        "% of unbounded",
        "served %",
        "rejected",
        "evictions",
        "offline LRU replay %",
        "run",
    ]
    rows: list[list[Any]] = []
    for trace, s in series.items():
        for p in s["curve"]:
            share = p["share_of_unbounded"]
            rows.append(
                [
                    trace,
                    f"{p['capacity_tokens']:.0e}",
                    p["pool_blocks"],
                    round(p["hit_rate"], 2),
                    None if share is None else round(share, 1),
                    round(p["served_share"], 1),
                    p["rejected"],
                    p["evictions"],
                    round(p["replay_lru"], 2),
                    "its own" if p["run"] == "own" else "the unbounded one",
                ]
            )
        u = s["unbounded"]
        rows.append(
            [
                trace,
                "unbounded",
                u["pool_blocks"],
                round(u["hit_rate"], 2),
                100.0,
                100.0 if not u["rejected"] else None,
                u["rejected"],
                u["evictions"],
                round(s["replay"]["published_rule"], 2),
                "its own",
            ]
        )
    return (
        "Each capacity is the engine's whole KV pool, one request at a time: at each lookup "
        "nothing runs, so every block of the pool is cache, evicted least recently freed "
        "first. A request that needs more blocks than the pool is rejected and its tokens are "
        "misses: `served %` is the share of the prompt tokens that ran at all, so at the "
        "smallest capacities the curve counts mostly which requests fit. The offline LRU "
        "replay of the same capacity (the hash ids alone, every request passing through the "
        "cache head to tail, the paper's counting) is beside it for reference: it differs "
        "where requests larger than the cache flush it (the engine refuses them instead) and "
        "where the engine, freeing a request's blocks tail first, keeps a prompt's head "
        "longer. A capacity whose pool holds the unbounded pool never fills: in the full form its "
        "point is the unbounded run's (`run`), which the quick form checks by running such "
        "a pool.\n\n" + markdown_table(rows, cols)
    )


def concurrency_section(series: dict[str, dict[str, Any]]) -> str:
    rows = []
    for trace, s in series.items():
        serial = s["unbounded"]
        rows.append(
            {
                "trace": trace,
                "run": "one at a time",
                "hit %": round(serial["hit_rate"], 4),
                "hit tokens": serial["hit_tokens"],
                "points lost": 0.0,
                "mean rows": 1.0,
                "makespan s": round(serial["makespan_s"], 1),
            }
        )
        for c in s["concurrent"]:
            rows.append(
                {
                    "trace": trace,
                    "run": c["run"].removeprefix(f"{trace} "),
                    "hit %": round(c["hit_rate"], 4),
                    "hit tokens": c["hit_tokens"],
                    "points lost": round(serial["hit_rate"] - c["hit_rate"], 4),
                    "mean rows": round(c["mean_rows"], 2),
                    "makespan s": round(c["makespan_s"], 1),
                }
            )
    return (
        "An offline replay sees every earlier request's blocks. In the engine a block is "
        "shared only once its K/V is written (published after the step that computes it): a "
        "request admitted while another with the same prefix is still being prefilled "
        "computes the unwritten part again. Measured on the unbounded pool: one request at a "
        "time, then up to 128 rows with chunked prefill (2,048-token chunks, 8,192 tokens a "
        "step) at the recorded arrivals timed as a Llama-3.1-8B on one H100, and the same "
        "with every request queued at t=0. `makespan s` is simulated.\n\n"
        + markdown_table(rows, list(rows[0]))
    )
