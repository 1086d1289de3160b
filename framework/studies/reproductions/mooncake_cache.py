"""Mooncake (FAST 2025): Table 2's prefix cache hit ratios of the conversation and synthetic
traces (published 40% and 66%) and Fig. 9's hit rate against the cache's capacity in tokens,
through nanoserve's own prefix cache (`framework/engine/prefix_cache.py`: 512-token blocks,
least recently freed evicted first).

Every run replays a trace on the simulated executor with `allocator=prefix_cache`,
`engine.block_size=512` (the traces' hash-id block), prefill only (1 output token: a hit
rate is a property of the prompts), and counts the share of all the trace's prompt tokens the
engine found cached (`prefix_hit_tokens` over the prompts' tokens).

- The capacity is the engine's KV pool, `engine.num_blocks` = capacity // 512, with one
  request at a time (`engine.max_num_seqs=1`): when a request is looked up nothing runs, so
  the whole pool is cache, an LRU of exactly that many blocks. A request larger than the pool
  cannot run at all: the engine rejects it, and its tokens count as misses (the served share
  is reported beside each point). The unbounded cache is a pool of every block the trace's
  requests could ever hold (sum over requests of ceil((prompt + output) / 512)): it never
  evicts, and neither does any larger pool, so in the full form a capacity at or above it
  takes the unbounded run's point (the quick form runs such a pool, and the suite checks it
  finds exactly the same).
- Two runs per trace measure what concurrency changes (a block is shared only once its K/V
  is written): the unbounded pool with up to 128 rows and chunked prefill (2,048-token
  chunks, 8,192 tokens a step; the routing study's engine) at the recorded arrivals, timed as
  a Llama-3.1-8B on one H100, and the same with every request queued at t=0.
- The traces' hash ids are also replayed offline (`hash_replay.py`): the paper's counting
  (37.4% and 65.1% on the shipped traces, the target), the engine's counting (the serial
  unbounded run must equal it exactly), and an LRU of each capacity (drawn for reference).

`--quick` replays the first `QUICK_LIMIT` lines of each trace at `QUICK_CAPACITIES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.engine.loop import RunResult
from framework.run.errors import UserError, user_input
from framework.run.paths import ROOT
from framework.studies.reproductions.cells import Assumption, Cell, PaperSetup
from framework.studies.reproductions.hash_replay import lru_share, read_rows, unbounded_share
from framework.studies.reproductions.jobs import Job, JobOutcome
from framework.studies.reproductions.mooncake_figure import draw
from framework.studies.reproductions.mooncake_tables import (
    concurrency_section,
    curve_section,
    replay_section,
)
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.workloads import check_workload

TRACE_DIR = ROOT.parent / "shared" / "data" / "traces"
TRACES = {
    "conversation": TRACE_DIR / "mooncake_conversation.jsonl",
    "synthetic": TRACE_DIR / "mooncake_synthetic.jsonl",
}
LLAMA_8B = ROOT / "framework" / "executors" / "simulated" / "models" / "llama-8b"

# A hit rate is a property of the prompts and the block they are hashed in, not of the model or
# GPU: the paper's ratios hold for any model that caches the traces' 512-token blocks.
PAPER = PaperSetup("the traces' 512-token blocks", {"engine.block_size": 512})
# The config of every run; a job adds its trace and pool, the user's overrides come last.
BASE = (
    "executor=simulated",
    "executor.hardware=h100-sxm",
    "executor.host_time=model",  # the profile's seconds: the same schedule on any machine
    "model=hf",
    f"model.path={LLAMA_8B}",
    "dtype=bfloat16",
    "model.max_model_len=262144",  # the synthetic trace's longest prompts are 191k tokens
    "workload=mooncake",
    "workload.max_output_tokens=1",  # prefill only
    "allocator=prefix_cache",
    "engine.block_size=512",
    "engine.max_num_seqs=1",  # one request at a time: the pool is all cache at each lookup
    "engine.max_num_batched_tokens=262144",  # a whole prompt in one step
)
# The concurrent runs: many rows and chunked prefill, as the routing study's engine.
CONCURRENT = (
    "scheduler=chunked",
    "scheduler.chunk_size=2048",
    "engine.max_num_batched_tokens=8192",
    "engine.max_num_seqs=128",
)
CAPACITIES = (1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 5e7, 1e8, 3e8, 1e9)  # tokens
QUICK_CAPACITIES = (1e4, 3e4, 1e5, 1e6, 3e6, 5e7)
QUICK_LIMIT = 80  # lines of each trace in the quick form

PUBLISHED_TABLE2 = {"conversation": 40.0, "synthetic": 66.0}  # %, Table 2
AT_3M = (41.0, 75.0)  # % of the largest hit rate at about 3M tokens (Fig. 9's text)
AT_50M = 100.0  # about 50M tokens reaches the largest hit rate (Fig. 9's text)
TARGET_POINTS = 3.0  # the unbounded run within this of the traces' own replay


def prompt_tokens(result: RunResult) -> dict[str, Any]:
    """Every request's prompt tokens, served or rejected: the hit rate's denominator."""
    return {"prompt_tokens": sum(len(s.spec.prompt_token_ids) for s in result.seqs)}


def hit_percent(m: dict[str, Any]) -> float:
    """Cached prompt tokens over all the trace's prompt tokens, in percent."""
    return 100 * m["prefix_hit_tokens"] / m["prompt_tokens"] if m["prompt_tokens"] else 0.0


def trace_overrides(path: Path, quick: bool) -> tuple[str, ...]:
    if not path.is_file():
        raise UserError(f"workload.path: the Mooncake trace {path} is not there (../shared)")
    return (f"workload.path={path}", f"workload.limit={QUICK_LIMIT if quick else 'null'}")


def unbounded_blocks(cfg: DictConfig) -> int:
    """A pool that holds every block every request could ever hold at once: never evicts."""
    with user_input():
        sizes = check_workload(OmegaConf.to_container(cfg.workload, resolve=True)) or []
    block = int(cfg.engine.block_size)
    return sum(-(-size // block) for size in sizes)


@dataclass
class TracePlan:
    """One trace's runs: its config, the unbounded pool, and which capacities run. A
    capacity whose pool holds the unbounded one never fills, so it finds exactly what the
    unbounded run finds: the full form takes its point from that run (`reuse`), the quick
    form runs it too, which is how the suite checks that equality."""

    trace: str
    cfg: DictConfig
    over: tuple[str, ...]
    pool: int  # the unbounded pool, in blocks
    block: int  # engine.block_size
    caps: list[int]  # the capacities on the curve, in tokens (at least one block each)
    reuse: bool

    def runs(self, cap: int) -> bool:
        return not (self.reuse and cap // self.block >= self.pool)

    def jobs(self) -> list[Job]:
        """Unbounded, each capacity that runs, then the two concurrent runs."""
        unbounded = (*self.over, f"engine.num_blocks={self.pool}")
        jobs = [Job(f"{self.trace} unbounded", unbounded, prompt_tokens)]
        jobs += [
            Job(
                f"{self.trace} {cap:.0e} tokens",
                (*self.over, f"engine.num_blocks={cap // self.block}"),
                prompt_tokens,
            )
            for cap in self.caps
            if self.runs(cap)
        ]
        jobs.append(Job(f"{self.trace} concurrent", (*unbounded, *CONCURRENT), prompt_tokens))
        burst = (*unbounded, *CONCURRENT, "workload.time_scale=0")
        jobs.append(Job(f"{self.trace} concurrent at t=0", burst, prompt_tokens))
        return jobs


def plan_trace(ctx: Context, trace: str, path: Path, caps: tuple[float, ...]) -> TracePlan:
    over = trace_overrides(path, ctx.quick)
    cfg = ctx.config([*BASE, *over])
    block = int(cfg.engine.block_size)
    kept = [int(c) for c in caps if int(c) // block >= 1]
    return TracePlan(trace, cfg, over, unbounded_blocks(cfg), block, kept, not ctx.quick)


def reproduce(ctx: Context) -> Outcome:
    caps = QUICK_CAPACITIES if ctx.quick else CAPACITIES
    plans = [plan_trace(ctx, trace, path, caps) for trace, path in TRACES.items()]
    done = ctx.run(BASE, [job for plan in plans for job in plan.jobs()])
    series: dict[str, dict[str, Any]] = {}
    for plan in plans:
        count = len(plan.jobs())
        series[plan.trace], done = trace_series(plan, done[:count]), done[count:]
    cells = table_cells(series) + figure_cells(series)
    return Outcome(
        cells=cells,
        assumptions=assumptions(),
        setup=setup(ctx.quick, caps),
        draw=lambda png: draw(png, series, PUBLISHED_TABLE2, AT_3M, AT_50M),
        config=ctx.config(BASE),
        paper_setup=PAPER,
        sections=[
            ("The traces' own replay", replay_section(series, TARGET_POINTS)),
            ("What a capacity means", curve_section(series)),
            ("Requests that arrive together", concurrency_section(series)),
        ],
        data={"series": series},
    )


def trace_series(plan: TracePlan, jobs: list[JobOutcome]) -> dict[str, Any]:
    """One trace's numbers: the unbounded run, the curve, the concurrent runs, the replay."""
    unbounded, *rest = jobs
    ran, concurrent, burst = iter(rest[:-2]), rest[-2], rest[-1]
    wl = plan.cfg.workload
    rows = read_rows(Path(wl.path), wl.limit)
    bt = int(wl.block_tokens)
    top = hit_percent(unbounded.metrics)
    points = []
    for cap in plan.caps:
        m = next(ran).metrics if plan.runs(cap) else unbounded.metrics
        blocks = cap // plan.block
        points.append(
            {
                "capacity_tokens": cap,
                "pool_blocks": blocks,
                "run": "own" if plan.runs(cap) else "unbounded",
                "hit_rate": hit_percent(m),
                "share_of_unbounded": 100 * hit_percent(m) / top if top else None,
                "served_share": 100 * m["prefix_query_tokens"] / m["prompt_tokens"],
                "rejected": m["requests_rejected"],
                "evictions": m["prefix_evictions"],
                "replay_lru": 100 * lru_share(rows, max(1, blocks * plan.block // bt), bt).share,
            }
        )
    return {
        "requests": unbounded.metrics["requests"],
        "prompt_tokens": unbounded.metrics["prompt_tokens"],
        "unbounded": {
            "pool_blocks": plan.pool,
            "hit_rate": top,
            "hit_tokens": unbounded.metrics["prefix_hit_tokens"],
            "evictions": unbounded.metrics["prefix_evictions"],
            "rejected": unbounded.metrics["requests_rejected"],
            "makespan_s": unbounded.metrics["makespan_s"],
        },
        "curve": points,
        "concurrent": [concurrent_row(j) for j in (concurrent, burst)],
        "replay": {
            "published_rule": 100 * unbounded_share(rows, bt, "published").share,
            "engine_rule": 100 * unbounded_share(rows, bt, "engine").share,
            "engine_rule_tokens": unbounded_share(rows, bt, "engine").hit_tokens,
        },
    }


def concurrent_row(job: JobOutcome) -> dict[str, Any]:
    m = job.metrics
    return {
        "run": job.name,
        "hit_rate": hit_percent(m),
        "hit_tokens": m["prefix_hit_tokens"],
        "mean_rows": m["mean_rows"],
        "makespan_s": m["makespan_s"],
        "rejected": m["requests_rejected"],
    }


def at_capacity(points: list[dict[str, Any]], tokens: float) -> dict[str, Any] | None:
    return next((p for p in points if p["capacity_tokens"] == int(tokens)), None)


def table_cells(series: dict[str, dict[str, Any]]) -> list[Cell]:
    return [
        Cell(
            f"{trace}: prompt tokens found cached, unbounded cache",
            PUBLISHED_TABLE2[trace],
            s["unbounded"]["hit_rate"],
            "%",
            source="Table 2",
        )
        for trace, s in series.items()
    ]


def figure_cells(series: dict[str, dict[str, Any]]) -> list[Cell]:
    """Fig. 9 as its text states it: the share of the largest hit rate at 3M and 50M tokens."""
    cells = []
    for trace, s in series.items():
        for tokens, published, high in ((3e6, *AT_3M), (5e7, AT_50M, None)):
            point = at_capacity(s["curve"], tokens)
            cells.append(
                Cell(
                    f"{trace}: hit rate at {tokens / 1e6:g}M tokens, % of the unbounded",
                    published,
                    None if point is None else point["share_of_unbounded"],
                    "%",
                    published_high=high,
                    source="Fig. 9, text (which curve is which workload: uncertain)",
                    note="" if point is not None else "capacity not in this run's grid",
                )
            )
    return cells


def setup(quick: bool, caps: tuple) -> str:
    lines = f"the first {QUICK_LIMIT} lines of each trace" if quick else "both traces whole"
    grid = ", ".join(f"{c:.0e}" for c in caps)
    return (
        f"Replayed: {lines} (`mooncake_conversation.jsonl`, 12,031 requests; "
        "`mooncake_synthetic.jsonl`, 3,993), each hash id a seeded block of 512 token ids "
        "(`workload=mooncake`), prompts as recorded, 1 output token. Engine: "
        "`executor=simulated` (the Llama-3.1-8B shape on one H100-SXM, analytic profile, "
        "`executor.host_time=model`), `allocator=prefix_cache`, `engine.block_size=512`, "
        f"one request at a time. Capacities (tokens): {grid}, each the pool "
        "(`engine.num_blocks` = capacity // 512; one that holds the unbounded pool is "
        "the unbounded run in the full form), and an unbounded pool; then the unbounded "
        "pool with 128 rows and chunked prefill at the recorded arrivals and with every "
        "request at t=0. Config: `BASE` and `CONCURRENT` in "
        "`framework/studies/reproductions/mooncake_cache.py`; the user's overrides are added "
        "to every run."
    )


def assumptions() -> list[Assumption]:
    return [
        Assumption(
            "A hit is a prompt token whose K/V the prefix cache holds at the request's "
            "admission, counted over all the trace's prompt tokens; outputs are 1 token, since "
            "the cached share depends on the prompts alone",
            "Table 2 counts prompt tokens; nanoserve's `prefix_hit_tokens`",
        ),
        Assumption(
            "The engine hits only full 512-token blocks and always computes a prompt's last "
            "token, where the published replay counts a request's blocks until its first "
            "miss, the last one cut to the prompt; what that costs on each trace is in the "
            "section 'The traces' own replay'",
            "framework/engine/prefix_cache.py; the papers' set-up notes",
        ),
        Assumption(
            "Each hash id stands for a seeded block of 512 token ids: equal ids, equal "
            "blocks, so the cache sees exactly the reuse the trace recorded",
            "the traces' README; framework/workloads/mooncake.py",
        ),
        Assumption(
            "Cache capacity = the KV pool with one request at a time; a request larger than "
            "the pool is not served and its tokens are misses, where an offline replay lets "
            "it pass through and flush the cache",
            "this reproduction's choice: nanoserve's pool holds the running request's blocks "
            "and the cache together",
        ),
        Assumption(
            "Eviction is least recently freed, a request's blocks freed tail first, so its "
            "head stays longest; the eviction behind Fig. 9 is taken to be LRU, which the "
            "shared notes do not state",
            "framework/engine/prefix_cache.py",
        ),
        Assumption(
            "Model and GPU (Llama-3.1-8B shape, one H100-SXM, context raised to 262,144 "
            "tokens for the synthetic trace's 191k-token prompts) set only the timing of the "
            "concurrent runs; the one-at-a-time hit rates do not depend on them",
            "Mooncake serves a larger model (not named); conf/experiment/routing.yaml",
        ),
        Assumption(
            "Fig. 9's published points are its text: about 3M tokens reach 41-75% of the "
            "largest hit rate and about 50M tokens reach it; which curve is which workload is "
            "not clear, so both traces are held to the whole range",
            "shared papers.md, section 4",
        ),
        Assumption(
            "The tool & agent trace (Table 2: 59%) is not shipped, so its cell is not reproduced",
            "the traces' README",
        ),
    ]
