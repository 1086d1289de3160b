"""The engine software profiles against published end-to-end results of the engines they name
(`executor.software`, docs/simulator-software.md): each case is a published set-up run on the
simulator under the profiles of the engines that ran it, its figures beside the published
ones. No number checked here was used to build a profile (each case says which profile
numbers it rests on).

    python -m experiments.sim.engine_check [--out DIR] [--quick]

Two kinds of case: an engine's absolute offline throughput on one GPU set-up (judged within
10%), and a published ratio of two engines or versions on one set-up (which no single fitted
constant can pass by accident). A case's simulated figures are analytic (an estimate for that
GPU, from its datasheet and the fitted kernel efficiencies) plus the profile's host costs;
every figure printed says so.
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framework.run.paths import ROOT
from framework.studies.reproductions.gpu_memory import kv_tokens
from framework.tracking.tables import markdown_table

MODELS = ROOT / "framework" / "executors" / "simulated" / "models"
LLAMA_8B, LLAMA_70B = MODELS / "llama-8b", MODELS / "llama-70b"
SHAREGPT = ROOT.parent / "shared" / "data" / "traces" / "sharegpt_v3_lengths.csv"
BLOCK = 16
WITHIN = 0.10  # the end-to-end target: an absolute throughput within 10% of the published


@dataclass(frozen=True)
class Side:
    """One engine of a case: its profile and settings, and what it published (if it did)."""

    label: str
    overrides: tuple[str, ...]
    published_rps: float | None = None  # requests per second
    published_tps: float | None = None  # output tokens per second


@dataclass(frozen=True)
class Case:
    """Two engines (or versions) on one published set-up: each side's absolute throughput
    where it was published, and the ratio a / b."""

    name: str
    published: float  # the ratio a / b of throughput
    source: str
    setup: tuple[str, ...]
    a: Side
    b: Side
    rests_on: str  # the profile numbers the simulated figures depend on


def vllm_versions(requests: int) -> Case:
    """vLLM 0.6.0 against 0.5.3: Llama 3 8B on one H100, ShareGPT, 500 prompts sent at once
    through the OpenAI server (the v0.6.0 performance post's throughput figure)."""
    common = (
        *machine(LLAMA_8B, "h100-sxm", 1, max_model_len=8192),
        *sharegpt(requests),
        "engine.max_num_seqs=256",
        "engine.max_num_batched_tokens=8192",
        "engine.kv_memory_mb=57000",  # 0.9 of 80 GB less 16 GB of bf16 weights
    )
    return Case(
        name="vLLM 0.6.0 / 0.5.3 throughput, Llama 3 8B, 1x H100, ShareGPT",
        published=2.7,
        source="vLLM v0.6.0 performance post (2024-09-05): 2.7x higher throughput on Llama 8B, "
        "1x H100, ShareGPT, 500 prompts",
        setup=common,
        a=Side("vLLM 0.6.0", ("executor.software=vllm-0.6",)),
        b=Side("vLLM 0.5.3", ("executor.software=vllm-0.5",)),
        rests_on="both profiles' per-row host and output costs (WukLab's vLLM 0.5.4 breakdown); "
        "0.5's API server per token (the post's 33%/29% split, not its throughput); 0.6's "
        "async output and its server's own process (the post's description)",
    )


def sglang_vs_vllm(requests: int, lengths: Path, big: bool) -> Case:
    """SGLang 0.3.0 against vLLM 0.6.0 offline (every prompt at once), ShareGPT, 5000
    prompts, as SGLang's repository published it (benchmark/benchmark_vllm_060/README.md):
    Llama 3.1 8B Instruct on one A100-80GB, or 70B Instruct on four H100s."""
    model, hardware, tp = (LLAMA_70B, "h100-sxm", 4) if big else (LLAMA_8B, "a100-80gb", 1)
    published = {  # (requests/s, output tokens/s): SGLang, then vLLM
        False: ((22.03, 4281.51), (21.27, 4132.37)),
        True: ((19.84, 3856.01), (19.04, 3700.64)),
    }[big]
    setup = (*machine(model, hardware, tp, max_model_len=4096), *sharegpt(requests, lengths))
    sglang = (
        "executor.software=sglang-0.3",
        # scheduler.py of 0.3: max_running_requests = min(max_total_num_tokens // 2, the
        # request pool's size - 1), the pool min(max(tokens / context_len * 512, 2048), 4096)
        # with context_len Llama 3.1's 131072: 2048
        "engine.max_num_seqs=2047",
        "engine.max_num_batched_tokens=16384",  # server_args.py of 0.3: max_prefill_tokens
        # mem_fraction_static: SGLang's 0.88 at TP 1; set to 0.88 at TP 4 by the benchmark
        f"engine.num_blocks={kv_tokens(model, hardware, tp, 0.88) // BLOCK}",
    )
    vllm = (
        "executor.software=vllm-0.6-multistep",
        "scheduler.decode_steps=10",  # --num-scheduler-steps 10: the queue looked at once a run
        "engine.max_num_seqs=256",  # vLLM 0.6's default
        # vLLM 0.6 config.py: chunked prefill off under 32K context, so max(max_model_len, 2048)
        "engine.max_num_batched_tokens=4096",
        f"engine.num_blocks={kv_tokens(model, hardware, tp, 0.9) // BLOCK}",  # utilization 0.9
    )
    gpus = "4x H100" if big else "1x A100-80GB"
    return Case(
        name=f"SGLang 0.3.0 / vLLM 0.6.0 offline, Llama 3.1 {'70B' if big else '8B'}, {gpus}",
        published=published[0][1] / published[1][1],
        source="SGLang repository, benchmark/benchmark_vllm_060/README.md (SGLang 0.3.0 against "
        "vLLM 0.6.0 with --num-scheduler-steps 10; ShareGPT, 5000 prompts, request rate inf)",
        setup=setup,
        a=Side("SGLang 0.3.0", sglang, *published[0]),
        b=Side("vLLM 0.6.0", vllm, *published[1]),
        rests_on="sglang-0.3's per-row scheduling bound (WukLab) and its eager steps' launches "
        "(dispatch_cost); vllm-0.6's per-row host and output costs (WukLab's vLLM 0.5.4) under "
        "multi-step 10; the analytic kernels of the GPU (fitted on held-apart operator tables)",
    )


def machine(model: Path, hardware: str, tp: int, max_model_len: int) -> tuple[str, ...]:
    return (
        "executor=simulated",
        f"executor.hardware={hardware}",
        f"executor.tensor_parallel={tp}",
        "model=hf",
        f"model.path={model}",
        "dtype=bfloat16",
        f"model.max_model_len={max_model_len}",
        "scheduler=prefill_first",
        "executor.api_server=true",
        "observers=[]",
    )


def sharegpt(requests: int, path: Path = SHAREGPT) -> tuple[str, ...]:
    return (
        "workload=trace",
        f"workload.path={path}",
        f"workload.limit={requests}",
        "workload.arrival=poisson",
        "workload.rate=1000000",  # every request at once, as the benchmarks' rate inf sends them
    )


def kept_sharegpt(out: Path) -> Path:
    """The trace's conversations that the benchmarks' ShareGPT sampler keeps (prompt and
    output of 4 tokens or more, prompt at most 1024, both at most 2048), in the file's order."""
    with SHAREGPT.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kept_by_vllm_filter"] == "1"]
    path = out / "sharegpt_kept.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["num_prefill_tokens", "num_decode_tokens"])
        w.writeheader()
        w.writerows({k: r[k] for k in w.fieldnames} for r in rows)
    return path


def throughput(overrides: list[str], out: Path) -> dict[str, Any]:
    from framework.studies.notebook import run

    r = run(overrides, out=out)
    m = r.metrics
    return {
        "requests_per_s": m["requests_finished"] / m["makespan_s"],
        "output_tokens_per_s": m["output_tokens_per_s"],
        "mean_output_tokens": float(r.requests["output_tokens"].mean()),
        "makespan_s": m["makespan_s"],
        "time_share_software": m.get("time_share_software", 0.0),
        "gpu_busy_share": m["busy_s"] / m["makespan_s"],
        "steps": m["steps"],
    }


def side_rows(case: Case, sims: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per side whose throughput was published: output tokens/s against 10%."""
    rows = []
    for side in (case.a, case.b):
        if side.published_tps is None or side.published_rps is None:
            continue
        sim = sims[side.label]
        dev = sim["output_tokens_per_s"] / side.published_tps - 1
        rows.append({
            "case": case.name, "engine": side.label,
            "published tok/s (req/s, tokens a request)": f"{side.published_tps:g} "
            f"({side.published_rps:g}, {side.published_tps / side.published_rps:.0f})",
            "simulated tok/s (req/s, tokens a request)": f"{sim['output_tokens_per_s']:.0f} "
            f"({sim['requests_per_s']:.2f}, {sim['mean_output_tokens']:.0f}) (simulated, analytic)",
            "deviation": f"{dev:+.1%}", "within 10%": "yes" if abs(dev) <= WITHIN else "no",
            "GPU busy (simulated)": f"{sim['gpu_busy_share']:.0%}",
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/engine_check"))
    ap.add_argument("--quick", action="store_true", help="a few requests a case (the suite's)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    kept = kept_sharegpt(args.out)
    offline = 40 if args.quick else 5000
    cases = [
        vllm_versions(50 if args.quick else 500),
        sglang_vs_vllm(offline, kept, big=False),
        sglang_vs_vllm(offline, kept, big=True),
    ]
    absolute, ratios, found = [], [], []
    for i, case in enumerate(cases):
        sims = {
            side.label: throughput([*case.setup, *side.overrides], args.out / f"{i}-{key}")
            for key, side in (("a", case.a), ("b", case.b))
        }
        a, b = sims[case.a.label], sims[case.b.label]
        ratio = a["output_tokens_per_s"] / b["output_tokens_per_s"]
        deviation = ratio / case.published - 1
        found.append({"case": case.name, "sides": sims, "ratio": ratio,
                      "published": case.published, "deviation": deviation,
                      "source": case.source, "rests_on": case.rests_on})  # fmt: skip
        absolute += side_rows(case, sims)
        ratios.append({
            "case": case.name, "published": f"{case.published:.3g}x",
            "simulated": f"{ratio:.3g}x (simulated, analytic)", "deviation": f"{deviation:+.1%}",
            "tok/s a / b (simulated)":
                f"{a['output_tokens_per_s']:.0f} / {b['output_tokens_per_s']:.0f}",
            "GPU busy a / b (simulated)": f"{a['gpu_busy_share']:.0%} / {b['gpu_busy_share']:.0%}",
        })  # fmt: skip
    text = "\n\n".join(
        [markdown_table(absolute, list(absolute[0])), markdown_table(ratios, list(ratios[0]))]
    )
    print(text)
    (args.out / "engine_check.md").write_text(text + "\n", encoding="utf-8")
    (args.out / "engine_check.json").write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
