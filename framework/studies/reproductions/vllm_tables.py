"""The vLLM reproduction's words: its set-up, its assumptions with their sources, and the
sections that set each number beside what moves it (`vllm_batching.py` makes the numbers)."""

from __future__ import annotations

from typing import Any

from framework.studies.reproductions.cells import Assumption
from framework.tracking.tables import markdown_table


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def setup(quick: bool, wls: dict[str, dict[str, Any]], size: dict[str, int]) -> str:
    rows = [
        [w["title"], str(w["requests"]), f"{w['rate']:g}", *(f"{x:.1f}" for x in w["means"][:2])]
        for w in wls.values()
    ]
    cols = ["workload", "requests", "rate (req/s)", "mean prompt", "mean output"]
    form = "quick form: " if quick else ""
    return (
        f"{form}OPT-13B's shape (`framework/executors/simulated/models/opt-13b`, fp16) on one "
        "A100-40GB (`executor.hardware=a100-40gb`, the analytic profile, the profile's own host "
        "seconds), a 12 GB KV pool (`engine.kv_memory_mb=12288`: 15,728 token slots of 800 KB, "
        "Table 1's 15.7K), 256 sequences and 2,560 tokens a step at most. Poisson arrivals.\n\n"
        f"{markdown_table(rows, cols)}\n\n"
        f"Sustainable rates: capacity searches over {size['capacity']} ShareGPT requests per "
        f"probe, at most {size['probes']} probes a search. Config: `BASE` and `SYSTEMS` in "
        "`framework/studies/reproductions/vllm_batching.py`; the user's overrides are added to "
        "every run."
    )


def batch_section(
    table: dict[str, dict[str, dict[str, Any]]],
    wls: dict[str, dict[str, Any]],
    fig13: dict[str, dict[str, float]],
) -> str:
    systems = list(next(iter(table.values())))
    rows = [
        [f"published, {trace}", *(f"{fig13[trace][s]:.2f}" for s in systems)]
        for trace in ("sharegpt", "alpaca")
    ]
    rows += [
        [wls[key]["title"], *(_f(runs[s]["mean_batched"]) for s in systems)]
        for key, runs in table.items()
    ]
    lat = "\n".join(
        f"- {wls[key]['title']}: normalized latency "
        + ", ".join(f"{s} {_f(runs[s].get('normalized_latency_s'), 3)}" for s in systems)
        + " s/token"
        for key, runs in table.items()
    )
    return (
        "Mean requests in a step's batch (`mean_batched`), every variant run:\n\n"
        + markdown_table(rows, ["workload", *systems])
        + "\n\nA batch is the requests in the system at once, so at a rate the system sustains "
        "it is the rate times the time a request stays (Little's law): the latencies below "
        "set it. Where a system cannot sustain the rate, its queue grows and its batch is "
        "what its memory admits.\n\n" + lat
    )


def memory_section(runs: dict[str, dict[str, Any]], fig2: dict[str, float]) -> str:
    keys = ("states", "reserved", "internal", "external", "free")
    rows = []
    for system, m in runs.items():
        held = 1 - m["kv_share_free"]
        share = 100 * m["kv_share_states"] / held if held > 0 else 0.0
        shares = [100 * m[f"kv_share_{k}"] for k in keys]
        rows.append([system, *(f"{x:.1f}%" for x in [*shares, share, fig2[system]])])
    cols = ["system", *keys, "token states / not free", "Fig. 2"]
    return (
        "The KV pool over the ShareGPT run, time-averaged (`kv_share_*` of metrics.json): "
        "token states; reserved for tokens not yet generated; internal fragmentation "
        "(reserved past the request's length); external fragmentation (free, outside the "
        "largest extent that could be placed); free.\n\n" + markdown_table(rows, cols)
    )


def capacity_section(
    capacity: dict[str, Any], bounds: tuple[float, ...], fig12: dict[str, tuple[float, float]]
) -> str:
    rows = []
    for system, by_bound in capacity.items():
        for bound, found in by_bound.items():
            probes = ", ".join(
                f"{p['rate']:.3g}: {_f(p['normalized_latency_s'], 3)}" for p in found["probes"]
            )
            rows.append([system, str(bound), _f(found["rate"], 3), str(found["status"]), probes])
    cols = ["system", "bound (s/token)", "sustainable rate (req/s)", "search", "probes"]
    published = "; ".join(f"vLLM / {s}: {lo:g}x-{hi:g}x" for s, (lo, hi) in fig12.items())
    return (
        "Sustainable: the highest Poisson rate at which the mean normalized latency over the "
        "run stays at or under the bound (the curve's knee in Fig. 12: past it a finite "
        "trace's latency grows with its length). Published, on ShareGPT across OPT-13B, "
        f"66B and 175B: {published}. Each probe: rate: normalized latency.\n\n"
        + markdown_table(rows, cols)
    )


def assumptions() -> list[Assumption]:
    return [
        Assumption(
            "OPT-13B on one A100-40GB with 12 GB of KV cache, 15.7K token slots of 800 KB",
            "vLLM paper, section 6.1 and Table 1",
        ),
        Assumption(
            "Batch caps: 256 sequences and 2,560 tokens a step for every system (vLLM 0.1's "
            "defaults, `max_num_seqs` and `max_num_batched_tokens`); the paper does not state "
            "its Orca reimplementation's caps",
            "vLLM v0.1.0, vllm/engine/arg_utils.py",
        ),
        Assumption(
            "The paper's vLLM ran PyTorch eager with its own kernels and no CUDA graphs (they "
            "came to vLLM later); the analytic profile prices a step as kernels at fitted "
            "efficiencies plus the A100's per-step overhead and modelled host time, as a "
            "CUDA-graph engine runs: one cost model for every reproduction",
            "vLLM v0.1.0 source; docs/simulator-analytic.md",
        ),
        Assumption(
            "Orca is reimplemented as the paper did: iteration-level batching with whole "
            "prefills in decode steps (`scheduler=continuous`), each request's KV one "
            "contiguous reservation from a buddy allocator (`engine.kv_layout=contiguous`), "
            "exact to the token (`engine.block_size=1`)",
            "vLLM paper, section 6.1 (baselines)",
        ),
        Assumption(
            "Orca (Max) reserves 2,048 tokens, OPT's context (`max_position_embeddings`)",
            "vLLM paper, section 6.1; OPT-13B's config.json",
        ),
        Assumption(
            "vLLM's scheduler runs prefills in steps of their own and preempts by recompute "
            "when the pool runs dry (`scheduler=prefill_first`, `preemption=recompute`)",
            "vLLM v0.1.0 scheduler; vLLM paper, section 4.5",
        ),
        Assumption(
            "ShareGPT's lengths are the shipped first turns that vLLM's benchmark keeps, in "
            "SmolLM2 tokens (mean about 236 in / 217 out against the paper's 161.31 / 337.99 "
            "in OPT tokens); a second run scales them to the paper's means",
            "shared/data/traces/README.md; vLLM paper, section 6.1",
        ),
        Assumption(
            "Alpaca's lengths are not shipped: drawn lognormal with the paper's means (19.31 "
            "in, 58.45 out), coefficient of variation 1 for the headline cells; cv 0 (fixed) "
            "and 2 show how far the choice moves the result",
            "this reproduction's choice; vLLM paper, section 6.1 for the means",
        ),
        Assumption(
            "A one-hour trace is shortened to 20 minutes of ShareGPT and 200 s of Alpaca "
            "arrivals; the mean batch is over every step of the run, ramp-up and drain "
            "included",
            "this reproduction's choice (run time on a 2-core CPU)",
        ),
        Assumption(
            "Fig. 2's token-state share is read as token states over the KV memory not free "
            "(the bars describe the memory the systems hold); the published figure values "
            "are a transcription [S]",
            "shared/papers.md, section 2",
        ),
        Assumption(
            "Sustainable rate: the highest rate whose mean normalized latency stays within "
            "0.25 or 0.5 s/token (the paper shows curves, not a rule); the published ratio "
            "ranges span three model sizes, the simulated ones two bounds on one",
            "this reproduction's rule; vLLM paper, Fig. 12",
        ),
    ]
