"""The engine software profiles against published end-to-end results of the engines they name
(`executor.software`, docs/simulator-software.md): each case is a published set-up run on the
simulator under one or two profiles, its figure beside the published one. No number checked
here was used to build a profile (each case says which profile numbers it rests on).

    python -m experiments.sim.engine_check [--out DIR] [--quick]

A case's simulated figures are analytic (an estimate for that GPU, from its datasheet and the
fitted kernel efficiencies) plus the profile's host costs; every figure printed says so.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framework.run.paths import ROOT
from framework.tracking.tables import markdown_table

LLAMA_8B = ROOT / "framework" / "executors" / "simulated" / "models" / "llama-8b"
SHAREGPT = ROOT.parent / "shared" / "data" / "traces" / "sharegpt_v3_lengths.csv"


@dataclass(frozen=True)
class Side:
    """One engine of a case: its profile and its settings."""

    label: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    """A published ratio of two engines' throughput on one set-up."""

    name: str
    published: float  # the ratio a / b
    source: str
    setup: tuple[str, ...]
    a: Side
    b: Side
    rests_on: str  # the profile numbers the simulated ratio depends on


def vllm_versions(requests: int) -> Case:
    """vLLM 0.6.0 against 0.5.3: Llama 3 8B on one H100, ShareGPT, 500 prompts sent at once
    through the OpenAI server (the v0.6.0 performance post's throughput figure)."""
    common = (
        "executor=simulated",
        "executor.hardware=h100-sxm",
        "model=hf",
        f"model.path={LLAMA_8B}",
        "dtype=bfloat16",
        "model.max_model_len=8192",
        "workload=trace",
        f"workload.path={SHAREGPT}",
        f"workload.limit={requests}",
        "workload.arrival=poisson",
        "workload.rate=1000000",  # every request at once, as the benchmark's rate inf sends them
        "engine.max_num_seqs=256",
        "engine.max_num_batched_tokens=8192",
        "engine.kv_memory_mb=57000",  # 0.9 of 80 GB less 16 GB of bf16 weights
        "scheduler=prefill_first",
        "executor.api_server=true",
        "observers=[]",
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


def throughput(overrides: list[str], out: Path) -> dict[str, Any]:
    from framework.studies.notebook import run

    r = run(overrides, out=out)
    m = r.metrics
    return {
        "requests_per_s": m["requests_finished"] / m["makespan_s"],
        "makespan_s": m["makespan_s"],
        "time_share_software": m.get("time_share_software", 0.0),
        "gpu_busy_share": m["busy_s"] / m["makespan_s"],
        "steps": m["steps"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/engine_check"))
    ap.add_argument("--quick", action="store_true", help="50 requests a case (the suite's)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [vllm_versions(50 if args.quick else 500)]
    rows, found = [], []
    for i, case in enumerate(cases):
        a = throughput([*case.setup, *case.a.overrides], args.out / f"{i}-a")
        b = throughput([*case.setup, *case.b.overrides], args.out / f"{i}-b")
        ratio = a["requests_per_s"] / b["requests_per_s"]
        deviation = ratio / case.published - 1
        found.append({"case": case.name, "a": a, "b": b, "ratio": ratio,
                      "published": case.published, "deviation": deviation,
                      "source": case.source, "rests_on": case.rests_on})  # fmt: skip
        rows.append({
            "case": case.name, "published": f"{case.published:g}x",
            "simulated": f"{ratio:.2f}x (simulated, analytic)", "deviation": f"{deviation:+.1%}",
            "req/s a / b (simulated)": f"{a['requests_per_s']:.2f} / {b['requests_per_s']:.2f}",
            "GPU busy a / b (simulated)": f"{a['gpu_busy_share']:.0%} / {b['gpu_busy_share']:.0%}",
        })  # fmt: skip
    table = markdown_table(rows, list(rows[0]))
    print(table)
    (args.out / "engine_check.md").write_text(table + "\n", encoding="utf-8")
    (args.out / "engine_check.json").write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
