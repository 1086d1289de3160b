"""SGLang 0.3.0 against vLLM 0.6.0, offline (every prompt at once), as SGLang's repository
published them: output tokens a second of Llama 3.1 8B Instruct on one A100-80GB and of
Llama 3.1 70B Instruct on four H100s, 5,000 ShareGPT prompts, and the ratio of the two
engines on each set-up.

Each engine is nanoserve under that engine's software profile (`executor.software`,
docs/simulator-software.md) and the defaults that engine ran with, each computed by the
engine's own rule for the model, GPU and parallelism asked:

- SGLang 0.3 (`sglang-0.3`): `mem_fraction_static` 0.88 of each GPU for weights and KV,
  `max_prefill_tokens` 16,384 a step, and at most `max_running_requests` rows, which its
  `scheduler.py` sets to min(KV tokens // 2, the request pool - 1), the pool being
  min(max(KV tokens / context length * 512, 2048), 4096) with the model's own context length;
- vLLM 0.6 with `--num-scheduler-steps 10` (`vllm-0.6-multistep`, `scheduler.decode_steps=10`:
  the queue looked at once a run of ten decode steps): `gpu_memory_utilization` 0.9, 256
  rows (`max_num_seqs`), and, chunked prefill being off under a 32K context, a step's token
  budget max(max_model_len, 2048) (`config.py`).

Both schedule prefills first (`scheduler=prefill_first`). The prompts are the conversations
of the shipped ShareGPT lengths that the benchmarks' sampler keeps (prompt and output of 4
tokens or more, prompt at most 1,024, both at most 2,048), in the file's order.

`--quick` runs 40 prompts a cell; the full form the published 5,000 and, for the 70B cell
that misses, SGLang's rows capped at three sizes: how much the figure hangs on the batch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from framework.run.paths import ROOT
from framework.studies.reproductions.cell_figure import draw_cells
from framework.studies.reproductions.cells import Assumption, Cell, PaperSetup
from framework.studies.reproductions.gpu_memory import kv_tokens
from framework.studies.reproductions.jobs import Job, JobOutcome
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.tracking.tables import markdown_table

MODELS = ROOT / "framework" / "executors" / "simulated" / "models"
SHAREGPT = ROOT.parent / "shared" / "data" / "traces" / "sharegpt_v3_lengths.csv"
BLOCK = 16
SGLANG, VLLM = "SGLang 0.3.0", "vLLM 0.6.0"

# The published runs (benchmark/benchmark_vllm_060/README.md): (requests/s, output tokens/s).
SOURCE = "SGLang repository, benchmark/benchmark_vllm_060/README.md"
PUBLISHED = {
    "8b": {SGLANG: (22.03, 4281.51), VLLM: (21.27, 4132.37)},
    "70b": {SGLANG: (19.84, 3856.01), VLLM: (19.04, 3700.64)},
}
SETUPS = {
    "8b": PaperSetup(
        "Llama 3.1 8B on one A100-80GB",
        {"model.path": str(MODELS / "llama-8b"), "executor.hardware": "a100-80gb",
         "executor.tensor_parallel": 1},
    ),
    "70b": PaperSetup(
        "Llama 3.1 70B on four H100s",
        {"model.path": str(MODELS / "llama-70b"), "executor.hardware": "h100-sxm",
         "executor.tensor_parallel": 4},
    ),
}  # fmt: skip
# End of the published data.

BASE = (
    "executor=simulated",
    "executor.host_time=model",  # the profiles' host seconds: the same schedule on any machine
    "executor.api_server=true",
    "model=hf",
    "dtype=bfloat16",
    "model.max_model_len=4096",  # the kept conversations' bound (2,048 + 2,048), both engines
    "scheduler=prefill_first",
    "workload=trace",
    "workload.arrival=poisson",
    "workload.rate=1000000",  # every prompt at once, as the benchmarks' rate inf sends them
    "observers=[]",
)
FULL, QUICK = 5000, 24
CAPS = (256, 512, 1024)  # SGLang's rows, capped: the full form's look at the 70B miss


def sglang_rules(cfg: DictConfig) -> tuple[str, ...]:
    """SGLang 0.3's defaults for the model and GPUs of `cfg` (its server_args.py and
    scheduler.py, as the module docstring states)."""
    model, tp = str(cfg.model.path), int(cfg.executor.tensor_parallel)
    tokens = kv_tokens(model, cfg.executor.hardware, tp, 0.88)
    context = int(_config(model)["max_position_embeddings"])
    pool = min(max(int(tokens / context * 512), 2048), 4096)
    return (
        "executor.software=sglang-0.3",
        f"engine.max_num_seqs={max(1, min(tokens // 2, pool - 1))}",
        "engine.max_num_batched_tokens=16384",
        f"engine.num_blocks={tokens // BLOCK}",
    )


def vllm_rules(cfg: DictConfig) -> tuple[str, ...]:
    """vLLM 0.6's defaults with `--num-scheduler-steps 10` for the model and GPUs of `cfg`."""
    model, tp = str(cfg.model.path), int(cfg.executor.tensor_parallel)
    tokens = kv_tokens(model, cfg.executor.hardware, tp, 0.9)
    return (
        "executor.software=vllm-0.6-multistep",
        "scheduler.decode_steps=10",
        "engine.max_num_seqs=256",
        f"engine.max_num_batched_tokens={max(int(cfg.model.max_model_len), 2048)}",
        f"engine.num_blocks={tokens // BLOCK}",
    )


RULES: dict[str, Callable[[DictConfig], tuple[str, ...]]] = {SGLANG: sglang_rules, VLLM: vllm_rules}


def _config(model: str) -> dict[str, Any]:
    return json.loads((Path(model) / "config.json").read_text())


def setup_overrides(key: str) -> tuple[str, ...]:
    return tuple(f"{k}={v}" for k, v in SETUPS[key].keys.items())


def kept_sharegpt(out: Path) -> Path:
    """The conversations of the shipped ShareGPT lengths the benchmarks' sampler keeps, in
    the file's order, written where the report goes."""
    with SHAREGPT.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kept_by_vllm_filter"] == "1"]
    path = out / "sharegpt_kept.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["num_prefill_tokens", "num_decode_tokens"])
        w.writeheader()
        w.writerows({k: r[k] for k in w.fieldnames} for r in rows)
    return path


def numbers(job: JobOutcome) -> dict[str, float]:
    m = job.metrics
    return {
        "tok/s": m["output_tokens_per_s"],
        "req/s": m["requests_finished"] / m["makespan_s"],
        "tokens a request": m["tokens_kept"] / max(m["requests_finished"], 1),
        "GPU busy": m["busy_s"] / m["makespan_s"],
        "rows a step": m["mean_rows"],
        "preemptions": m["preemptions"],
    }


def cells_of(key: str, runs: dict[str, dict[str, float]], cfg: DictConfig) -> list[Cell]:
    """One set-up's cells: each engine's output tokens a second, then their ratio."""
    name = SETUPS[key].label
    cells = [
        Cell(f"{name}: {engine}", PUBLISHED[key][engine][1], runs[engine]["tok/s"], "tok/s",
             source=f"{SOURCE}, output token throughput")
        for engine in RULES
    ]  # fmt: skip
    ratio = PUBLISHED[key][SGLANG][1] / PUBLISHED[key][VLLM][1]
    cells.append(
        Cell(f"{name}: SGLang / vLLM", round(ratio, 3), runs[SGLANG]["tok/s"] / runs[VLLM]["tok/s"],
             "x", source=f"{SOURCE}, the two throughputs' ratio")
    )  # fmt: skip
    return SETUPS[key].held_to(cells, cfg)


def reproduce(ctx: Context) -> Outcome:
    requests = QUICK if ctx.quick else FULL
    base = (*BASE, f"workload.path={kept_sharegpt(ctx.out)}", f"workload.limit={requests}")
    configs = {key: ctx.config([*base, *setup_overrides(key)]) for key in SETUPS}
    rules = {(key, e): RULES[e](cfg) for key, cfg in configs.items() for e in RULES}
    jobs = [Job(f"{key} {e}", (*setup_overrides(key), *r)) for (key, e), r in rules.items()]
    caps = [] if ctx.quick else [
        Job(f"70b {SGLANG}, {n} rows", (*setup_overrides("70b"), *rules["70b", SGLANG],
                                        f"engine.max_num_seqs={n}"))
        for n in CAPS
    ]  # fmt: skip
    done = {j.name: numbers(j) for j in ctx.run(base, [*jobs, *caps])}
    runs = {key: {e: done[f"{key} {e}"] for e in RULES} for key in SETUPS}
    cells = [c for key in SETUPS for c in cells_of(key, runs[key], configs[key])]
    table = [{"run": name, **{k: f"{v:.3g}" for k, v in got.items()}} for name, got in done.items()]
    sections = [("Each run", markdown_table(table, list(table[0])))]
    if caps:
        own = dict(o.split("=", 1) for o in rules["70b", SGLANG])["engine.max_num_seqs"]
        capped = {f"{own} (its rule's)": done[f"70b {SGLANG}"]}
        capped |= {str(n): done[f"70b {SGLANG}, {n} rows"] for n in CAPS}
        sections.append(("The 70B SGLang cell against its batch", _caps_text(capped)))
    setup = (
        f"{requests} prompts of the kept ShareGPT conversations sent at once to each engine, on "
        "the simulated executor (analytic kernels of each GPU plus the engine's software "
        "profile). Each engine's defaults, computed for the model and GPUs asked:\n\n"
        + "\n".join(f"- {key}, {e}: `{' '.join(r)}`" for (key, e), r in rules.items())
    )
    return Outcome(
        cells=cells,
        assumptions=ASSUMPTIONS,
        setup=setup,
        draw=lambda png: draw_cells(png, cells, "SGLang 0.3.0 and vLLM 0.6.0 offline (simulated)"),
        config=configs["8b"],
        sections=sections,
        data={"runs": done, "rules": {f"{k} {e}": list(r) for (k, e), r in rules.items()}},
    )


def _caps_text(capped: dict[str, dict[str, float]]) -> str:
    """The 70B SGLang runs by the rows they were allowed, against the published figure."""
    published = PUBLISHED["70b"][SGLANG][1]
    rows = [
        {"SGLang's rows at most": cap, "tok/s (simulated)": f"{got['tok/s']:.0f}",
         "deviation": f"{got['tok/s'] / published - 1:+.1%}",
         "rows a step": f"{got['rows a step']:.0f}", "preemptions": f"{got['preemptions']:.0f}"}
        for cap, got in capped.items()
    ]  # fmt: skip
    return (
        markdown_table(rows, list(rows[0]))
        + "\n\nThe simulated 70B SGLang figure hangs on how many rows SGLang really ran: "
        "nanoserve lets the batch fill the whole KV pool and preempts when it runs out. Not "
        "modelled, and growing with tensor parallelism and SGLang's large batches: SGLang "
        "0.3's admission reserve (`new_token_ratio` of each running request's remaining "
        "output, retracting when decoding runs out), its scheduler's broadcast of each batch "
        "to the four TP workers, and its eager decode steps over 160 rows at TP 4. A profile "
        "of SGLang at TP 4 and that admission rule as a policy are what would close it."
    )


ASSUMPTIONS = [
    Assumption(
        "Host seconds are the engines' software profiles (sglang-0.3, vllm-0.6-multistep), "
        "none of whose numbers was fitted to these cells",
        "docs/simulator-software.md: each number's source",
    ),
    Assumption(
        "The prompts' lengths are SmolLM2-tokenized ShareGPT conversations, not Llama 3.1's",
        "shared/data/traces: the shipped lengths",
    ),
    Assumption(
        "The KV pool is the memory fraction less the weights; the engines' activation reserve "
        "is not modelled, so the pools are upper bounds",
        "gpu_memory.kv_tokens",
    ),
]
