"""The engine software profiles against published end-to-end results of the engines they name
(`executor.software`, docs/simulator-software.md): each case is a published set-up run on the
simulator under the profiles of the engines that ran it, its figures beside the published
ones. No number checked here was used to build a profile (each case says which profile
numbers it rests on).

    python -m experiments.sim.engine_check [--out DIR] [--quick]

A case is a published ratio of two engines or versions on one set-up (which no single fitted
constant can pass by accident), each side's absolute throughput beside it where it was
published (judged within 10%). The engines' absolute offline throughput on two GPUs, SGLang
0.3 against vLLM 0.6, is a reproduction of its own: `python -m experiments.reproduce
sglang_offline`. A case's simulated figures are analytic (an estimate for that
GPU, from its datasheet and the fitted kernel efficiencies) plus the profile's host costs;
every figure printed says so.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framework.run.paths import ROOT
from framework.tracking.tables import markdown_table

MODELS = ROOT / "framework" / "executors" / "simulated" / "models"
LLAMA_8B = MODELS / "llama-8b"
SHAREGPT = ROOT.parent / "shared" / "data" / "traces" / "sharegpt_v3_lengths.csv"
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
    cases = [vllm_versions(50 if args.quick else 500)]
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
    tables = [absolute, ratios] if absolute else [ratios]
    text = "\n\n".join(markdown_table(rows, list(rows[0])) for rows in tables)
    print(text)
    (args.out / "engine_check.md").write_text(text + "\n", encoding="utf-8")
    (args.out / "engine_check.json").write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
