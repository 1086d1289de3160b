"""The Sarathi-Serve reproduction's words: its set-up, its assumptions with their sources, and
the sections that set each capacity beside what bounds it (`sarathi_capacity.py` makes the
numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from framework.studies.reproductions.cells import Assumption
from framework.tracking.tables import markdown_table

SOURCE = "artifact `microsoft/sarathi-serve`, branch `osdi-sarathi-serve`"


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def setup(quick: bool, size: dict[str, Any], blocks: int, slos: Sequence[Any]) -> str:
    form = "Quick form: " if quick else ""
    budgets = ", ".join(f"{s.chunk} tokens under the {s.name} SLO" for s in slos)
    rows = [
        [
            "vLLM",
            "`scheduler=prefill_first allocator=incremental allocator.watermark=0.01 "
            "engine.max_num_seqs=128 engine.max_num_batched_tokens=8192`",
        ],
        [
            "Orca",
            "`scheduler=continuous allocator=worst_case allocator.reserve=max "
            "engine.max_num_seqs=16 engine.max_num_batched_tokens=131072`",
        ],
        [
            "Sarathi-Serve",
            "`scheduler=chunked scheduler.chunk_size=C allocator=incremental "
            "allocator.watermark=0.01 engine.max_num_seqs=128 engine.max_num_batched_tokens=C`, "
            f"C = {budgets}",
        ],
    ]
    return (
        f"{form}Mistral-7B's shape (`framework/executors/simulated/models/mistral-7b`, fp16, "
        "its 4,096-token sliding window priced by the analytic model) on one A100-80GB PCIe "
        "(`executor.hardware=a100-80gb-pcie`, tensor parallel 1, the profile's own host "
        "seconds), a KV pool of "
        f"{blocks:,} blocks of 16 tokens ({blocks * 16:,} token slots: 0.85 of 80 GB less the "
        "weights), max sequence length 8,192. Requests: the first "
        f"{size['requests']:,} of `sharegpt4_8k_lengths.csv` shuffled with seed 42, Poisson "
        "arrivals.\n\n"
        f"{markdown_table(rows, ['system', 'nanoserve settings'])}\n\n"
        "Capacity: the highest rate with median scheduling delay <= 2 s and P99 TBT <= the "
        f"SLO, by `find_capacity` from {size['low']:g} req/s (doubling to a bracket, then "
        f"bisecting to {100 * size['tolerance']:g}%), at most {size['probes']} probes a "
        "search. Config: `MACHINE`, `VLLM`, `ORCA`, `sarathi()` in "
        "`framework/studies/reproductions/sarathi_capacity.py`; the user's overrides are "
        "added to every run."
    )


def capacity_section(capacity: dict[str, dict[str, Any]], slos: Sequence[Any]) -> str:
    rows = []
    for slo in slos:
        for system, found in capacity[slo.name].items():
            met = _probe_at(found, found["rate"])
            missed = _probe_at(found, found["high"])
            used = (
                f"{met['peak_blocks']:,} of {met['num_blocks']:,}"
                if met and met.get("peak_blocks") is not None
                else "-"
            )
            delay, tbt = (
                _f(met[k] if met else None) for k in ("scheduling_delay_p50_s", "tbt_p99_s")
            )
            why = ", ".join(missed["missed"]) if missed else "-"
            rate, status, high = _f(found["rate"]), str(found["status"]), _f(found["high"])
            rows.append([slo.name, system, rate, status, delay, tbt, used, high, why])
    cols = [
        "SLO",
        "system",
        "capacity (req/s)",
        "search",
        "P50 delay at capacity (s)",
        "P99 TBT at capacity (s)",
        "KV blocks used at capacity",
        "first rate missed",
        "what it missed",
    ]
    probes = []
    for slo in slos:
        for system, found in capacity[slo.name].items():
            steps = ", ".join(
                f"{p['rate']:.3g} {'met' if p['passed'] else 'missed'} "
                f"({_f(p['scheduling_delay_p50_s'])} s, {_f(p['tbt_p99_s'])} s)"
                for p in found["probes"]
            )
            probes.append(f"- {slo.name}, {system}: {steps}")
    return (
        "Each search's capacity, the probe that set it, and the lowest rate probed that missed "
        "the SLO with the condition it missed: the P99 TBT bound is a stall limit (a prefill "
        "run beside or instead of the decodes), the delay bound a throughput limit (the queue "
        "grows).\n\n"
        + markdown_table(rows, cols)
        + "\n\nEvery probe, in order: rate (req/s) met or "
        "missed (P50 scheduling delay, P99 TBT):\n\n" + "\n".join(probes)
    )


def _probe_at(found: dict[str, Any], rate: float | None) -> dict[str, Any] | None:
    if rate is None:
        return None
    return next((p for p in found["probes"] if p["rate"] == rate), None)


def same_rate_section(same: dict[str, Any]) -> str:
    keys = ("tbt_p99_s", "tbt_p50_s", "scheduling_delay_p50_s", "ttft_p50_s", "mean_rows")
    rows = [
        [name, *(_f(m[k]) for k in keys), str(m["requests_finished"])]
        for name, m in same["systems"].items()
    ]
    cols = ["system", "P99 TBT (s)", "P50 TBT (s)", "P50 scheduling delay (s)", "P50 TTFT (s)"]
    cols += ["mean batch", "finished"]
    return (
        f"Every system at {same['rate']:g} req/s (the scheduling delays say whether a queue "
        "formed): the median gap between tokens is a decode step everywhere, and the P99 is "
        "where they part. vLLM runs each admitted prompt in a step of its own while every "
        "decode waits; Orca runs it whole inside the decode step; Sarathi-Serve runs at most "
        "a chunk of it beside the decodes, so its P99 is a step of one full budget. A stall "
        "sets the P99 only where stalled gaps are more than 1% of all gaps: at light load or "
        "over few requests vLLM's P99 is a plain decode step, below Sarathi-Serve's budget "
        "step.\n\n" + markdown_table(rows, cols)
    )


def paper_section(
    capacity: dict[str, dict[str, Any]],
    decode_ms: float | None,
    published_ms: float,
    order: dict[str, tuple[tuple[str, str], ...]],
) -> str:
    ranked = []
    for slo, by_system in capacity.items():
        rates = {s: f["rate"] for s, f in by_system.items()}
        names = sorted(rates, key=lambda s: -(rates[s] or 0.0))
        ranked.append(
            f"- {slo}: " + " > ".join(f"{s} ({_f(rates[s])})" for s in names) + " req/s; "
            "the paper states " + ", ".join(f"{a} > {b}" for a, b in order[slo])
        )
    return (
        f"{_published_text()}\n\nSimulated order:\n\n"
        + "\n".join(ranked)
        + "\n\n"
        + _decode_text(decode_ms, published_ms)
    )


def _decode_text(decode_ms: float | None, published_ms: float) -> str:
    """The SLOs against the simulated GPU: Table 3's bounds are multiples of one decode
    iteration on the paper's A100, so a faster or slower simulated iteration loosens or
    tightens them by as much."""
    head = (
        "The SLOs are 5x and 25x a decode iteration of 32 requests at 4K prompt tokens "
        f"(section 5.1), {published_ms:g} ms by Table 3; the simulated iteration is "
    )
    if decode_ms is None:
        return head + "not measured."
    off = decode_ms / published_ms - 1
    if abs(off) <= 0.15:
        return head + (
            f"{decode_ms:.3g} ms ({100 * off:+.0f}%), so the SLOs ask about as much of the "
            "simulated GPU as of the paper's."
        )
    tighter = "tighter" if off > 0 else "looser"
    return head + (
        f"{decode_ms:.3g} ms ({100 * off:+.0f}%), so the SLOs are {tighter} for the simulated "
        "GPU than for the paper's by as much."
    )


def _published_text() -> str:
    return (
        "Published for Mistral-7B on one A100 (the paper's text; the artifact holds configs, "
        "not results): 2.6x vLLM's capacity (abstract, section 1); Sarathi-"
        "Serve above Orca and vLLM in all cases and vLLM significantly above Orca under the "
        "relaxed SLO (section 5.1); 3.5x vLLM under the strict SLO with a 512-token budget in "
        "the SLO sweep against vLLM at max batch 32, 64 and 128 (section 5.2, Fig. 12). The "
        "per-bar values of Fig. 10 are not stated; readings of the figure by third parties "
        "disagree, so no cell is held to them."
    )


def assumptions() -> list[Assumption]:
    return [
        Assumption(
            "Mistral-7B in fp16 on one A100 80GB PCIe, tensor parallel 1",
            f"paper section 5, Table 1; {SOURCE}, `mistral7b_*.yml` (tp_1) and "
            "`benchmark_runner.py` (dtype float16)",
        ),
        Assumption(
            "The model's sliding window (4,096 tokens) is priced: attention reads at most "
            "4,096 tokens of KV. The artifact ran `Mistral-7B-Instruct-v0.2`, whose config has "
            "no window, and its Mistral model and FlashAttention wrapper pass none, so its "
            "attention over contexts past 4,096 tokens read the whole context",
            f"paper Table 1 (GQA-SW); {SOURCE}, `mistral7b_*.yml` (identifier), "
            "`sarathi/model_executor/models/mistral.py`",
        ),
        Assumption(
            "Max batch 128 (vLLM, Sarathi-Serve) and 16 (Orca); Sarathi-Serve's token budget "
            "512 (strict) and 2,048 (relaxed) for the whole step, decodes included",
            f"{SOURCE}, `mistral7b_strict.yml`, `mistral7b_relaxed.yml`, "
            "`sarathi/core/scheduler/sarathi_scheduler.py`",
        ),
        Assumption(
            "vLLM's step holds at most 8,192 prompt tokens (`max_num_batched_tokens` = the "
            "max sequence length); Orca's has no token cap (16 x 8,192) and books 8,192 tokens "
            "of paged blocks per request at admission, without a watermark; vLLM and "
            "Sarathi-Serve keep 1% of the blocks free when admitting",
            f"{SOURCE}, `capacity_search/config/config.py`, `sarathi/config.py`, "
            "`sarathi/core/block_space_manager/`",
        ),
        Assumption(
            "The KV pool is 0.85 of the card's 80 GB (the spec's `memory_capacity`) less the "
            "fp16 weights, in blocks of 16 tokens; the artifact also subtracts the peak "
            "activation memory of a profiling forward (not modelled), and reads the card's "
            "total from CUDA",
            f"{SOURCE}, `default.yml` (gpu_memory_utilization 0.85), `model_runner.py` "
            "(`profile_num_available_blocks`), `arg_utils.py` (block_size 16)",
        ),
        Assumption(
            "2,048 requests a probe, the trace shuffled with seed 42 and read from the top; "
            "Poisson arrivals (the artifact clips each gap at 3x the mean, which raises its "
            "true rate 5% over the nominal one and thins the bursts: not done here)",
            f"{SOURCE}, figure-5-6 README and `mistral7b_*.yml` (num_requests), "
            "`trace_request_length_generator.py`, `poisson_request_interval_generator.py`",
        ),
        Assumption(
            "Capacity: median scheduling delay <= 2 s and P99 TBT <= the SLO (0.1 s strict, "
            "0.5 s relaxed); search to 2.5%. The artifact bisects arithmetically from 0 to "
            "twice its start rate (4 req/s), with a 30-minute limit a trial; here the bracket "
            "is found by doubling from 1 req/s and bisected geometrically, and every run "
            "drains",
            f"paper section 5.1 and Table 3; {SOURCE}, `capacity_search/main.py` and "
            "`capacity_search.py`",
        ),
        Assumption(
            "Scheduling delay is arrival to first admission, TBT every gap between a "
            "request's consecutive tokens (the artifact's `request_scheduling_delay` and "
            "`decode_token_execution_plus_preemption_time`)",
            f"{SOURCE}, `capacity_search.py`; `framework/run/summary.py`",
        ),
        Assumption(
            "A step is priced by the analytic per-operator model (CUDA-graph decode, the "
            "profile's host seconds beside the GPU); the artifact ran PyTorch eager with its "
            "scheduler between steps: one cost model for every reproduction",
            "docs/simulator-analytic.md; the artifact's `sarathi/` (no CUDA graphs)",
        ),
    ]


def rules_section(
    decode: float | None,
    rules: Sequence[Any],
    on: str | None,
    paper: str,
    elsewhere: Sequence[str],
    multiples: tuple[int, int],
    step: tuple[int, int],
) -> str:
    """What the SLOs are here and why: Table 3's on a set-up the paper ran (`on`, the label of
    that set-up; `paper` the headline one's), computed by the paper's rule elsewhere."""
    strict_x, relaxed_x = multiples
    used = ", ".join(f"{slo.name} {slo.tbt_p99_s:.3g} s" for slo in rules)
    computed = (
        "-"
        if decode is None
        else f"{strict_x * decode / 1000:.3g} s and {relaxed_x * decode / 1000:.3g} s"
    )
    lines = [
        f"The paper's rule (section 5.1): the strict SLO on P99 TBT is {strict_x}x, the relaxed "
        f"{relaxed_x}x, the decode iteration of {step[0]} requests at {step[1]} tokens. "
        f"Simulated here: {'-' if decode is None else f'{decode:.1f} ms'}, so {computed}.",
        "",
    ]
    if on is None:
        lines.append(
            "This is not a set-up the paper ran (" + "; ".join(elsewhere) + "): the searches "
            f"use the computed SLOs ({used}), and the paper's values stand beside the cells as "
            f"{paper}'s, not as targets."
        )
    elif on == paper:
        lines.append(
            f"On the paper's set-up the searches use Table 3's values ({used}), the paper's "
            "rounding of the same rule for its 20 ms step."
        )
    else:
        lines.append(
            f"This is the paper's other set-up ({on}): the searches use the artifact's SLOs for "
            f"it ({used}), and only the claims the paper makes for every model are targets; the "
            "computed SLOs above are a check of the rule against the paper's rounding."
        )
    return "\n".join(lines)
