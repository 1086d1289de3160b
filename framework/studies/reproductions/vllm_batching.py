"""vLLM / PagedAttention (SOSP 2023): Fig. 13 (the mean number of requests batched together on
ShareGPT at 2 req/s and Alpaca at 30 req/s, four systems), Fig. 2 (the share of KV memory
holding token states) and Fig. 12's ratios of sustainable request rates, on OPT-13B with a
12 GB KV pool on one A100-40GB.

The four systems are nanoserve settings, nothing paper-specific:

- Orca (Max), (Pow2), (Oracle): `scheduler=continuous` (Orca's iteration-level batching,
  whole prefills in decode steps), `allocator=worst_case` with `allocator.reserve=max|pow2|
  oracle`, `engine.kv_layout=contiguous` (each reservation one extent of a buddy allocator, as
  the paper reimplemented Orca), `engine.block_size=1` (a reservation exact to the token);
- vLLM: `scheduler=prefill_first` (vLLM's first scheduler: prefills in steps of their own),
  `allocator=incremental` (paged blocks as tokens arrive), blocks of 16 tokens.

Mean batched requests is `mean_batched`: the requests in a step's running batch (its rows,
and under vLLM's scheduler the decodes that sit a prefill step out), averaged over steps. The
memory shares are `kv_share_*`, time-averaged over the run; Fig. 2's token-state share is
read as the token states' share of the memory not free (states / (1 - free)), since the
paper's bars describe the memory the systems hold. Sustainable (Fig. 12): the highest Poisson
rate at which the mean normalized latency (end-to-end latency / output tokens, averaged over
requests) stays at or below a bound; the ratios are given at two bounds, which make their
range.

`--quick` runs a few hundred requests of each workload and a short capacity search.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.run.paths import ROOT
from framework.studies.reproductions.cells import Cell, PaperSetup
from framework.studies.reproductions.gpu_memory import gpu_bytes, weight_bytes
from framework.studies.reproductions.jobs import Job
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.studies.reproductions.search import SearchJob
from framework.studies.reproductions.vllm_figure import draw
from framework.studies.reproductions.vllm_lengths import (
    drawn_pairs,
    means,
    scaled_to,
    sharegpt_pairs,
    write_lengths,
)
from framework.studies.reproductions.vllm_tables import (
    assumptions,
    batch_section,
    capacity_section,
    memory_section,
    setup,
)
from framework.studies.slo import parse_condition

SHAREGPT = ROOT.parent / "shared" / "data" / "traces" / "sharegpt_v3_lengths.csv"
OPT_13B = ROOT / "framework" / "executors" / "simulated" / "models" / "opt-13b"

PAPER = PaperSetup(
    "OPT-13B on one A100-40GB",
    {"model.path": str(OPT_13B), "executor.hardware": "a100-40gb", "executor.tensor_parallel": 1},
)
# OPT-13B on one A100-40GB with 12 GB of KV cache (Table 1: 15.7K token slots of 800 KB),
# vLLM 0.1's batch caps (256 sequences, 2,560 tokens a step), on the profile's own host
# seconds so that every machine simulates the same schedule. The KV memory follows the model
# and GPU asked (`kv_memory_mb`); the base states the paper's.
PAPER_KV_MB = 12288
BASE = (
    "executor=simulated",
    "executor.hardware=a100-40gb",
    "executor.host_time=model",
    "executor.software=vllm-0.1",  # the paper's system: vLLM 0.1, eager (software/vllm-0.1.yaml)
    "model=hf",
    f"model.path={OPT_13B}",
    "dtype=float16",
    f"engine.kv_memory_mb={PAPER_KV_MB}",
    "engine.max_num_seqs=256",
    "engine.max_num_batched_tokens=2560",
    "workload=trace",
    "workload.arrival=poisson",
)
ORCA = ("scheduler=continuous", "allocator=worst_case", "engine.kv_layout=contiguous")
SYSTEMS: dict[str, tuple[str, ...]] = {
    "Orca (Max)": (*ORCA, "allocator.reserve=max", "engine.block_size=1"),
    "Orca (Pow2)": (*ORCA, "allocator.reserve=pow2", "engine.block_size=1"),
    "Orca (Oracle)": (*ORCA, "allocator.reserve=oracle", "engine.block_size=1"),
    "vLLM": ("scheduler=prefill_first", "allocator=incremental", "engine.block_size=16"),
}
ORDER = tuple(SYSTEMS)

# The paper's numbers ([P] text, [S] figure values: shared/papers.md, section 2).
PAPER_MEANS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}
RATES = {"sharegpt": 2.0, "alpaca": 30.0}  # req/s, Fig. 13
FIG13 = {
    "sharegpt": {"Orca (Max)": 7.00, "Orca (Pow2)": 9.81, "Orca (Oracle)": 13.62, "vLLM": 30.42},
    "alpaca": {"Orca (Max)": 7.00, "Orca (Pow2)": 43.24, "Orca (Oracle)": 72.75, "vLLM": 132.44},
}
FIG2 = {"Orca (Max)": 20.4, "Orca (Pow2)": 26.8, "Orca (Oracle)": 38.2, "vLLM": 96.3}  # %
FIG12 = {"Orca (Oracle)": (1.7, 2.7), "Orca (Max)": (2.7, 8.0)}  # vLLM's rate / theirs
BATCH_RATIOS = {"Orca (Oracle)": 2.2, "Orca (Max)": 4.3}  # vLLM's batch / theirs, ShareGPT
BOUNDS = (0.25, 0.5)  # s/token: the normalized latency a sustainable rate stays within

# Full and quick sizes: requests per run, and the capacity search's.
# The quick form's few requests are offered at `load` times the paper's rates, so that memory
# binds within seconds of arrivals, as it does within the hour at the paper's rates.
FULL = {"sharegpt": 2400, "alpaca": 6000, "capacity": 1000, "probes": 10, "load": 1}
QUICK = {"sharegpt": 100, "alpaca": 300, "capacity": 60, "probes": 3, "load": 4}
ALPACA_CVS = (1.0, 0.0, 2.0)  # lognormal's coefficient of variation; the first is the headline


def workloads(ctx: Context, size: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The length files of every workload variant, written into the report's folder."""
    folder = ctx.out / "lengths"
    shared = sharegpt_pairs(SHAREGPT)
    variants = {
        "sharegpt": ("ShareGPT, shipped lengths (SmolLM2 tokens)", shared),
        "sharegpt_paper_means": (
            "ShareGPT, scaled to the paper's means (what the tokenizer changes)",
            scaled_to(shared, *PAPER_MEANS["sharegpt"]),
        ),
    }
    for cv in ALPACA_CVS if not ctx.quick else ALPACA_CVS[:1]:
        variants[f"alpaca_cv{cv:g}"] = (
            f"Alpaca, {'fixed at the means' if cv == 0 else f'lognormal, cv {cv:g}'}",
            drawn_pairs(size["alpaca"], *PAPER_MEANS["alpaca"], cv=cv, seed=0),
        )
    out = {}
    for key, (title, pairs) in variants.items():
        trace = "sharegpt" if key.startswith("sharegpt") else "alpaca"
        n = size[trace]
        path = write_lengths(folder / f"{key}.csv", pairs[:n])
        out[key] = {
            "title": title,
            "trace": trace,
            "path": path,
            "requests": n,
            "means": means(pairs[:n]),
            "rate": RATES[trace] * size["load"],
        }
    return out


def kv_memory_mb(model: Path = OPT_13B, hardware: str = "a100-40gb", tp: int = 1) -> int:
    """One GPU's KV memory for the model and GPU asked, by Table 1's own arithmetic: the GPU's
    memory less its share of the fp16 weights, less what Table 1 leaves on the paper's
    set-up for activations and the rest (40 GB - 25.7 GB of OPT-13B - 12 GB of KV: 1.4 GB),
    held the same. On the paper's set-up: the paper's 12 GB."""
    rest = gpu_bytes("a100-40gb") - weight_bytes(OPT_13B) - PAPER_KV_MB * 2**20
    free = gpu_bytes(hardware) - weight_bytes(model, tp) - rest
    if free < 2**20:
        raise ValueError(
            f"model.path={model}: its fp16 weights leave no KV memory on {hardware} x{tp} "
            "(raise executor.tensor_parallel)"
        )
    return int(free // 2**20)


def base_for(ctx: Context) -> tuple[str, ...]:
    """BASE with the KV memory the paper's rule gives for the model, GPU and parallelism
    asked (a user's own `engine.kv_memory_mb` still comes last, and wins)."""
    x = ctx.config(BASE)
    mb = kv_memory_mb(Path(str(x.model.path)), str(x.executor.hardware), x.executor.tensor_parallel)
    return (*BASE, f"engine.kv_memory_mb={mb}")


def reproduce(ctx: Context) -> Outcome:
    size = QUICK if ctx.quick else FULL
    base = base_for(ctx)
    wls = workloads(ctx, size)
    jobs = [
        Job(
            f"{key} {system}",
            (
                *over,
                f"workload.path={w['path']}",
                f"workload.limit={w['requests']}",
                f"workload.rate={w['rate']}",
            ),
        )
        for key, w in wls.items()
        for system, over in SYSTEMS.items()
    ]
    done = ctx.run(base, jobs)
    runs = {job.name: job.metrics for job in done}
    table = {
        key: {s: runs[f"{key} {s}"] for s in ORDER}
        for key in wls  # workload variant -> system -> metrics
    }
    slower = None if ctx.quick else at_paper_latency(ctx, base, wls["sharegpt_paper_means"], table)
    if slower is not None:
        wls["sharegpt_paper_latency"], table["sharegpt_paper_latency"] = slower
    capacity = capacities(ctx, base, wls["sharegpt"]["path"], size)
    cells = (
        batch_cells(table, size["load"])
        + memory_cells(table["sharegpt"])
        + capacity_cells(capacity)
    )
    return Outcome(
        cells=cells,
        assumptions=assumptions(),
        setup=setup(ctx.quick, wls, size),
        draw=lambda png: draw(png, table, capacity, FIG13, FIG2),
        config=ctx.config(base),
        paper_setup=PAPER,
        sections=[
            ("Batched requests, and what moves them", batch_section(table, wls, FIG13)),
            ("KV memory", memory_section(table["sharegpt"], FIG2)),
            ("Sustainable rates", capacity_section(capacity, BOUNDS, FIG12)),
        ],
        data={
            "workloads": {
                k: {**{x: y for x, y in w.items() if x != "path"}, "file": str(w["path"])}
                for k, w in wls.items()
            },
            "runs": {k: {s: _slim(m) for s, m in v.items()} for k, v in table.items()},
            "capacity": capacity,
        },
    )


def at_paper_latency(
    ctx: Context,
    base: tuple[str, ...],
    w: dict[str, Any],
    table: dict[str, dict[str, dict[str, Any]]],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]] | None:
    """A diagnostic, not a cell: the paper-means ShareGPT runs again with every simulated
    second stretched so that vLLM's requests stay as long as the paper's numbers imply.

    By Little's law a batch is the rate times the time a request stays, so vLLM's published
    30.42 requests at 2 req/s imply 15.2 s a request; the simulated vLLM's mean end-to-end
    latency on the same mean lengths, over that, is the `executor.speed` that would make it
    so. If the batches then land near the paper's, the deviation of the headline cells is the
    step time, not the memory managers."""
    ours = table["sharegpt_paper_means"]["vLLM"]["e2e_mean_s"]
    implied = FIG13["sharegpt"]["vLLM"] / RATES["sharegpt"]
    if not ours:
        return None
    speed = ours / implied
    over = (
        f"workload.path={w['path']}",
        f"workload.limit={w['requests']}",
        f"workload.rate={w['rate']}",
        f"executor.speed={speed:.4f}",
    )
    jobs = [Job(f"sharegpt_paper_latency {s}", (*o, *over)) for s, o in SYSTEMS.items()]
    done = ctx.run(base, jobs)
    title = (
        f"diagnostic: ShareGPT at the paper's means, every second / {speed:.3f} "
        f"(vLLM's requests {implied:.1f} s long, as its published batch implies)"
    )
    return {**w, "title": title, "speed": speed}, {
        s: job.metrics for s, job in zip(SYSTEMS, done, strict=True)
    }


def _slim(m: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "mean_batched",
        "normalized_latency_s",
        "e2e_mean_s",
        "tpot_p50_s",
        "makespan_s",
        "requests_finished",
        "steps",
    )
    return {k: m.get(k) for k in keys} | {k: v for k, v in m.items() if k.startswith("kv_share")}


def token_state_share(m: dict[str, Any]) -> float:
    """Token states as a share of the KV memory not free, in percent (Fig. 2's reading)."""
    held = 1.0 - m["kv_share_free"]
    return 100 * m["kv_share_states"] / held if held > 0 else 0.0


def capacities(
    ctx: Context, base: tuple[str, ...], lengths: Path, size: dict[str, int]
) -> dict[str, Any]:
    """Each system's sustainable ShareGPT rate under each bound: one capacity search each,
    through `ctx.search` (a system's searches under both bounds share their runs)."""
    bounds = BOUNDS if not ctx.quick else BOUNDS[-1:]
    pairs = [(system, bound) for system in SYSTEMS for bound in bounds]
    searches = [
        SearchJob(
            f"{system} normalized latency <= {bound:g}",
            (
                *SYSTEMS[system],
                f"workload.path={lengths}",
                f"workload.limit={size['capacity']}",
            ),
            (parse_condition(f"normalized_latency<={bound:g}"),),
            label=f"capacity {system}",
            low=0.5,
            max_probes=size["probes"],
        )
        for system, bound in pairs
    ]
    out: dict[str, Any] = {system: {} for system in SYSTEMS}
    for (system, bound), found in zip(pairs, ctx.search(base, searches), strict=True):
        out[system][f"{bound:g}"] = {
            "rate": found.result.goodput,
            "status": found.result.status,
            "probes": [
                {"rate": p.rate, "normalized_latency_s": p.metrics.get("normalized_latency_s")}
                for p in found.result.probes
            ],
        }
    return out


def batch_cells(table: dict[str, dict[str, dict[str, Any]]], load: float) -> list[Cell]:
    cells = []
    for trace, key, label in (
        ("sharegpt", "sharegpt", "ShareGPT"),
        ("alpaca", "alpaca_cv1", "Alpaca"),
    ):
        rate = RATES[trace] * load
        for system in ORDER:
            cells.append(
                Cell(
                    f"{label} at {rate:g} req/s: {system} mean batched requests",
                    FIG13[trace][system],
                    table[key][system]["mean_batched"],
                    "requests",
                    source="Fig. 13",
                )
            )
    vllm = table["sharegpt"]["vLLM"]["mean_batched"]
    for system, published in BATCH_RATIOS.items():
        theirs = table["sharegpt"][system]["mean_batched"]
        cells.append(
            Cell(
                f"ShareGPT: vLLM / {system} batched requests",
                published,
                vllm / theirs if theirs else None,
                "x",
                source="section 6.2, text",
            )
        )
    return cells


def memory_cells(runs: dict[str, dict[str, Any]]) -> list[Cell]:
    return [
        Cell(
            f"ShareGPT: {system} KV memory holding token states",
            FIG2[system],
            token_state_share(runs[system]),
            "%",
            source="Fig. 2 [S]; text: 20.4% - 38.2% for the existing systems",
            note="token states / memory not free",
        )
        for system in ORDER
    ]


def capacity_cells(capacity: dict[str, Any]) -> list[Cell]:
    cells = []
    for system, (low, high) in FIG12.items():
        for bound, mine in capacity["vLLM"].items():
            theirs = capacity[system][bound]["rate"]
            ours = mine["rate"]
            cells.append(
                Cell(
                    f"ShareGPT: vLLM / {system} sustainable rate, normalized latency <= "
                    f"{bound} s/token",
                    low,
                    ours / theirs if ours and theirs else None,
                    "x",
                    published_high=high,
                    source="Fig. 12, text (OPT-13B to 175B)",
                )
            )
    return cells
