"""Sarathi-Serve (OSDI 2024): the serving capacity of Mistral-7B on one A100-80GB PCIe under
vLLM, Orca and Sarathi-Serve, at the strict (P99 TBT <= 0.1 s) and relaxed (<= 0.5 s) SLOs on
the openchat ShareGPT-4 lengths: the paper's capacity figure (Fig. 10 of its text, the
artifact's `osdi-experiments/figure-5-6`) and the abstract's 2.6x over vLLM.

The three systems are nanoserve settings, each fact from the artifact (`microsoft/sarathi-
serve`, branch `osdi-sarathi-serve`: `osdi-experiments/figure-5-6/mistral7b_*.yml`,
`sarathi/benchmark/capacity_search/`, `sarathi/core/scheduler/`, `sarathi/config.py`):

- vLLM: `scheduler=prefill_first` (admitted prompts run in steps of their own, decodes wait),
  paged KV (`allocator=incremental`, the block manager's 1% watermark), 128 sequences, 8,192
  tokens a step (`vllm_scheduler_max_tokens_in_batch` = the trace's max sequence length);
- Orca: `scheduler=continuous` (whole prefills in decode steps), 16 sequences, 16 x 8,192
  tokens a step (`OrcaSchedulerConfig`: no token cap), paged KV with every request booked
  at its maximum length at admission (`OrcaBlockSpaceManager`: `allocator=worst_case
  allocator.reserve=max`, max length 8,192);
- Sarathi-Serve: `scheduler=chunked`, 128 sequences, a token budget of 512 (strict) or 2,048
  (relaxed) for the whole step, decodes first (`SarathiScheduler`: `chunk_size -
  num_batched_tokens` left to prefill chunks): `engine.max_num_batched_tokens` = the chunk.

Capacity: the highest Poisson rate at which the median scheduling delay is at most 2 s and
the P99 TBT at most the SLO (the artifact's `_is_under_sla`), by `find_capacity` (bracket
from 1 req/s by doubling, then bisection) to the artifact's 2.5% granularity. Each probe
serves the artifact's 2,048 requests, drawn as it draws them: the trace shuffled with seed
42 (pandas' `sample(frac=1, random_state=42)`, the same permutation as numpy's
`RandomState(42).choice`), its first rows. The searches run through `ctx.search`
(`ctx.workers` at once), vLLM's two sharing their runs and Orca's two theirs, since their
runs do not depend on the SLO: a rate both searches probe runs once.

Beside the searches: every system at one rate (what a prefill stall does to P99 TBT at equal
load) and one decode iteration of 32 rows at 4K context (the step the paper's SLOs are 5x and
25x of). `--quick` serves the first `QUICK['requests']` requests at higher rates, two probes
a search.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from framework.run.paths import ROOT
from framework.studies.goodput_search import CapacityResult
from framework.studies.reproductions.cells import Cell, PaperSetup
from framework.studies.reproductions.gpu_memory import kv_tokens
from framework.studies.reproductions.jobs import Job
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.studies.reproductions.sarathi_figure import draw
from framework.studies.reproductions.sarathi_tables import (
    assumptions,
    capacity_section,
    paper_section,
    rules_section,
    same_rate_section,
    setup,
)
from framework.studies.reproductions.search import SearchJob
from framework.studies.slo import Condition, parse_condition

SHAREGPT4 = ROOT.parent / "shared" / "data" / "traces" / "sharegpt4_8k_lengths.csv"
MISTRAL_7B = ROOT / "framework" / "executors" / "simulated" / "models" / "mistral-7b"
YI_34B = ROOT / "framework" / "executors" / "simulated" / "models" / "yi-34b"
HARDWARE = "a100-80gb-pcie"
MAX_LEN = 8192  # the trace's max_seq_len, the model's max_model_len (capacity_search config)
BLOCK_SIZE = 16  # sarathi/engine/arg_utils.py
MEMORY_UTILIZATION = 0.85  # sarathi/benchmark/config/default.yml
WEIGHT_BYTES = 2  # float16: sarathi/benchmark/benchmark_runner.py passes dtype="float16"
SHUFFLE_SEED = 42  # the benchmark's seed (default.yml), which shuffles the trace
DELAY_S = 2.0  # median scheduling delay at most (capacity_search/main.py)

MACHINE = (
    "executor=simulated",
    f"executor.hardware={HARDWARE}",
    "executor.host_time=model",  # the profile's host seconds: the same schedule on any machine
    "executor.software=sarathi-serve",  # the artifact's engine, eager (software/sarathi-serve.yaml)
    "model=hf",
    f"model.path={MISTRAL_7B}",
    "dtype=float16",
    f"model.max_model_len={MAX_LEN}",
    f"engine.block_size={BLOCK_SIZE}",
)
PAGED = ("allocator=incremental", "allocator.watermark=0.01")
VLLM = (
    "scheduler=prefill_first",
    *PAGED,
    "engine.max_num_seqs=128",
    f"engine.max_num_batched_tokens={MAX_LEN}",
)
ORCA = (
    "scheduler=continuous",
    "allocator=worst_case",
    "allocator.reserve=max",
    "engine.max_num_seqs=16",
    f"engine.max_num_batched_tokens={16 * MAX_LEN}",
)


def sarathi(chunk: int) -> tuple[str, ...]:
    """Sarathi-Serve with a token budget of `chunk` for the whole step, decodes included."""
    return (
        "scheduler=chunked",
        f"scheduler.chunk_size={chunk}",
        *PAGED,
        "engine.max_num_seqs=128",
        f"engine.max_num_batched_tokens={chunk}",
    )


@dataclass(frozen=True)
class Slo:
    """One of the paper's two SLOs for Mistral-7B (Table 3) and Sarathi-Serve's token budget
    under it (section 5.1; the artifact's `mistral7b_strict.yml` / `_relaxed.yml`)."""

    name: str
    tbt_p99_s: float
    chunk: int

    def systems(self) -> dict[str, tuple[str, ...]]:
        return {"vLLM": VLLM, "Orca": ORCA, "Sarathi-Serve": sarathi(self.chunk)}

    def conditions(self) -> list[Condition]:
        return [
            parse_condition(f"scheduling_delay_p50<={DELAY_S:g}"),
            parse_condition(f"tbt_p99<={self.tbt_p99_s:g}"),
        ]


# Table 3's values for Mistral-7B, the paper's rounding of 5x and 25x its 20 ms decode
# iteration: the rule on the paper's own set-up (`slos`).
SLOS = (Slo("strict", 0.1, 512), Slo("relaxed", 0.5, 2048))
STRICT_X, RELAXED_X = 5, 25  # section 5.1: the SLOs as multiples of the decode iteration
# The paper's other set-up on this hardware: Yi-34B on an NVLink pair (figure-5-6/yi34_*.yml,
# `tp_dimension: 2`), its SLOs the artifact README's `--tbt-slo-value` 0.2 and 1.0 s.
YI = PaperSetup(
    "Yi-34B on two A100 80GB PCIe (TP 2)",
    {"model.path": str(YI_34B), "executor.hardware": HARDWARE, "executor.tensor_parallel": 2},
)
PAPER = PaperSetup(
    "Mistral-7B on one A100 80GB PCIe",
    {"model.path": str(MISTRAL_7B), "executor.hardware": HARDWARE, "executor.tensor_parallel": 1},
    others=(YI,),
)
TABLE3 = {PAPER.label: SLOS, YI.label: (Slo("strict", 0.2, 512), Slo("relaxed", 1.0, 2048))}
SYSTEMS = ("vLLM", "Orca", "Sarathi-Serve")
PUBLISHED_RATIO = 2.6  # Sarathi-Serve / vLLM, Mistral-7B on one A100: abstract, section 1
# What section 5.1's text states of the order: Sarathi-Serve above both baselines in every
# case, and vLLM above Orca under the relaxed SLO. (a, b): a's capacity exceeds b's.
PAPER_ORDER = {
    "strict": (("Sarathi-Serve", "vLLM"), ("Sarathi-Serve", "Orca")),
    "relaxed": (("Sarathi-Serve", "vLLM"), ("Sarathi-Serve", "Orca"), ("vLLM", "Orca")),
}
# Table 3's strict SLO (0.1 s) is 5x a decode iteration of 32 requests at 4K prefill length,
# its relaxed one (0.5 s) 25x: both say 20 ms (section 5.1).
DECODE_ITERATION_MS = 20.0
DECODE_ROWS, DECODE_CONTEXT, DECODE_OUTPUT = 32, 4096, 16

FULL = {"requests": 2048, "low": 1.0, "probes": 12, "tolerance": 0.025, "same_rate": 1.5}
# The quick form's few requests at higher rates: a run's steps follow its simulated length.
QUICK = {"requests": 48, "low": 2.0, "probes": 2, "tolerance": 0.025, "same_rate": 2.0}


def kv_blocks(model: Path = MISTRAL_7B, hardware: str = HARDWARE, tp: int = 1) -> int:
    """The artifact's KV pool in 16-token blocks, for the model and GPU asked:
    `gpu_memory_utilization` (0.85) of one GPU's memory less its share of the fp16 weights
    (`profile_num_available_blocks`; the peak activation memory it also subtracts is not
    modelled), each GPU holding its share of every token's K and V."""
    blocks = kv_tokens(model, hardware, tp, MEMORY_UTILIZATION, WEIGHT_BYTES) // BLOCK_SIZE
    if blocks < 1:
        raise ValueError(
            f"model.path={model}: its fp16 weights leave no KV memory on {hardware} x{tp} "
            "(raise executor.tensor_parallel)"
        )
    return blocks


def slos(decode_ms: float | None, on: PaperSetup | None) -> tuple[Slo, Slo]:
    """The SLOs the searches hold each system to: Table 3's on a set-up the paper ran (`on`),
    else 5x and 25x the decode iteration just simulated for the model and GPU asked (section
    5.1's rule), the token budgets the artifact pairs with each."""
    if on is not None:
        return TABLE3[on.label]
    if decode_ms is None:
        return SLOS
    strict, relaxed = SLOS
    return (
        Slo(strict.name, STRICT_X * decode_ms / 1000, strict.chunk),
        Slo(relaxed.name, RELAXED_X * decode_ms / 1000, relaxed.chunk),
    )


def shuffled_lengths(out: Path) -> Path:
    """The trace in the artifact's order (`TraceRequestLengthGenerator`: shuffled with the
    benchmark's seed), written beside the report so the runs read it as a trace."""
    lines = SHAREGPT4.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    order = np.random.RandomState(SHUFFLE_SEED).choice(len(rows), size=len(rows), replace=False)
    path = out / "lengths" / "sharegpt4_8k_shuffled.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *(rows[i] for i in order)]) + "\n")
    return path


def reproduce(ctx: Context) -> Outcome:
    size = QUICK if ctx.quick else FULL
    asked = ctx.config(MACHINE)
    x = asked.executor
    blocks = kv_blocks(Path(str(asked.model.path)), str(x.hardware), int(x.tensor_parallel))
    machine = (*MACHINE, f"engine.num_blocks={blocks}")
    decode = decode_iteration(ctx, machine)  # first: a bad override is refused before any file
    on = PAPER.which(asked)
    elsewhere = [] if on else PAPER.differences(asked)
    rules = slos(decode, on)
    lengths = shuffled_lengths(ctx.out)
    base = (
        *machine,
        "workload=trace",
        "workload.arrival=poisson",
        f"workload.path={lengths}",
        f"workload.limit={size['requests']}",
    )
    same = same_rate(ctx, base, size["same_rate"])
    capacity = run_searches(ctx, base, size, rules)
    cells = [*capacity_cells(capacity, rules), decode_cell(decode)]
    return Outcome(
        cells=cells,
        assumptions=assumptions(),
        setup=setup(ctx.quick, size, blocks, rules),
        draw=lambda png: draw(png, capacity, PUBLISHED_RATIO),
        config=ctx.config(base),
        paper_setup=PAPER,
        sections=[
            (
                "The SLOs, for the model and GPU asked",
                rules_section(
                    decode,
                    rules,
                    on.label if on else None,
                    PAPER.label,
                    elsewhere,
                    (STRICT_X, RELAXED_X),
                    (DECODE_ROWS, DECODE_CONTEXT),
                ),
            ),
            ("Capacity, and what bounds it", capacity_section(capacity, rules)),
            ("Equal load: what a prefill stall does", same_rate_section(same)),
            (
                "Against the paper",
                paper_section(capacity, decode, DECODE_ITERATION_MS, PAPER_ORDER),
            ),
        ],
        data={
            "capacity": capacity,
            "same_rate": same,
            "decode_iteration_ms": decode,
            "slos": {slo.name: {"tbt_p99_s": slo.tbt_p99_s, "chunk": slo.chunk} for slo in rules},
            "paper_setup": on.label if on else None,
            "kv_blocks": blocks,
            "lengths": str(lengths),
        },
    )


def decode_iteration(ctx: Context, machine: tuple[str, ...]) -> float | None:
    """The median time between tokens of 32 requests with 4K-token prompts decoding together
    (vLLM's settings: every prompt first, then decode steps of all 32 rows), in ms."""
    prompts = ",".join([str(DECODE_CONTEXT)] * DECODE_ROWS)
    outputs = ",".join([str(DECODE_OUTPUT)] * DECODE_ROWS)
    job = Job(
        f"decode iteration: {DECODE_ROWS} rows at {DECODE_CONTEXT} tokens",
        (*VLLM, f"workload.prompt_lens=[{prompts}]", f"workload.output_lens=[{outputs}]"),
    )
    (done,) = ctx.run((*machine, "workload=fixed"), [job])
    tbt = done.metrics.get("tbt_p50_s")
    return None if tbt is None else 1000 * tbt


SAME_RATE_KEYS = (
    "tbt_p99_s",
    "tbt_p50_s",
    "scheduling_delay_p50_s",
    "ttft_p50_s",
    "mean_rows",
    "requests_finished",
    "preemptions",
)


def same_rate(ctx: Context, base: tuple[str, ...], rate: float) -> dict[str, Any]:
    """Every system (Sarathi-Serve with both budgets) at one Poisson rate."""
    systems: dict[str, tuple[str, ...]] = {"vLLM": VLLM, "Orca": ORCA}
    systems |= {f"Sarathi-Serve ({slo.chunk})": sarathi(slo.chunk) for slo in SLOS}
    jobs = [
        Job(f"same rate {name} at {rate:g} req/s", (*over, f"workload.rate={rate!r}"))
        for name, over in systems.items()
    ]
    done = ctx.run(base, jobs)
    return {
        "rate": rate,
        "systems": {
            name: {k: job.metrics.get(k) for k in SAME_RATE_KEYS}
            for name, job in zip(systems, done, strict=True)
        },
    }


def run_searches(
    ctx: Context, base: tuple[str, ...], size: dict[str, Any], rules: tuple[Slo, Slo]
) -> dict[str, dict[str, Any]]:
    """Every system's capacity under every SLO, by SLO then system. vLLM's and Orca's runs
    do not depend on the SLO, so their two searches share their runs (`ctx.search`)."""
    pairs = [(slo, system) for slo in rules for system in SYSTEMS]
    jobs = [
        SearchJob(
            f"{slo.name} {system}",
            slo.systems()[system],
            tuple(slo.conditions()),
            label=system,
            low=size["low"],
            tolerance=size["tolerance"],
            max_probes=size["probes"],
        )
        for slo, system in pairs
    ]
    capacity: dict[str, dict[str, Any]] = {slo.name: {} for slo in rules}
    for (slo, system), found in zip(pairs, ctx.search(base, jobs), strict=True):
        capacity[slo.name][system] = summary(found.result)
    return capacity


PROBE_KEYS = (
    "scheduling_delay_p50_s",
    "tbt_p99_s",
    "tbt_p50_s",
    "mean_rows",
    "peak_blocks",
    "num_blocks",
    "preemptions",
)


def summary(found: CapacityResult) -> dict[str, Any]:
    """A search as JSON: the capacity, its bracket, and every probe with what it missed."""
    return {
        "rate": found.goodput,
        "low": found.low,
        "high": found.high,
        "status": found.status,
        "probes": [
            {
                "rate": p.rate,
                "passed": p.passed,
                "missed": [c.condition.text for c in p.checks if not c.passed],
                **{k: p.metrics.get(k) for k in PROBE_KEYS},
            }
            for p in found.probes
        ],
    }


def ratio(capacity: dict[str, Any], slo: str) -> float | None:
    """Sarathi-Serve's capacity over vLLM's under `slo`."""
    ours, theirs = capacity[slo]["Sarathi-Serve"]["rate"], capacity[slo]["vLLM"]["rate"]
    return ours / theirs if ours is not None and theirs else None


def pairs_in_order(capacity: dict[str, Any], slo: str) -> int:
    """How many of the paper's stated orderings under `slo` the capacities keep."""
    rates = {s: capacity[slo][s]["rate"] for s in SYSTEMS}
    return sum(
        1
        for a, b in PAPER_ORDER[slo]
        if rates[a] is not None and (rates[b] is None or rates[a] > rates[b])
    )


def capacity_cells(capacity: dict[str, Any], rules: tuple[Slo, Slo]) -> list[Cell]:
    cells = [
        Cell(
            f"{slo.name} SLO (P99 TBT <= {slo.tbt_p99_s:g} s): {system} capacity",
            None,
            capacity[slo.name][system]["rate"],
            "req/s",
            source="Fig. 10 draws it; no value stated (readings disagree: shared/papers.md §3)",
        )
        for slo in rules
        for system in SYSTEMS
    ]
    strict, relaxed = rules
    cells.append(
        Cell(
            f"strict SLO: Sarathi-Serve / vLLM capacity ratio (chunk {strict.chunk})",
            PUBLISHED_RATIO,
            ratio(capacity, strict.name),
            "x",
            source="abstract and section 1: 2.6x for Mistral-7B on one A100",
        )
    )
    cells.append(
        Cell(
            f"relaxed SLO: Sarathi-Serve / vLLM capacity ratio (chunk {relaxed.chunk})",
            None,
            ratio(capacity, relaxed.name),
            "x",
            source="not stated for Mistral-7B under the relaxed SLO (abstract, text)",
        )
    )
    for slo in rules:
        stated = PAPER_ORDER[slo.name]
        text = ", ".join(f"{a} > {b}" for a, b in stated)
        cells.append(
            Cell(
                f"{slo.name} SLO: the paper's orderings kept ({text})",
                len(stated),
                pairs_in_order(capacity, slo.name),
                "pairs",
                every_setup=True,
                source="section 5.1 text: Sarathi-Serve above both in all cases"
                + ("; vLLM significantly above Orca under relaxed" if len(stated) > 2 else ""),
            )
        )
    return cells


def decode_cell(ms: float | None) -> Cell:
    return Cell(
        f"decode iteration, {DECODE_ROWS} requests at {DECODE_CONTEXT // 1024}K prompt tokens",
        DECODE_ITERATION_MS,
        ms,
        "ms",
        source="section 5.1 and Table 3: the SLOs are 5x (0.1 s) and 25x (0.5 s) this step",
    )
