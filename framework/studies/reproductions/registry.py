"""Every reproduction by name, with the paper and the figure it reproduces. The module is
imported only when its reproduction runs, so `--list` and a mistyped name answer at once."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from framework.run.errors import UserError
from framework.studies.reproductions.reproduction import Context, Outcome


@dataclass(frozen=True)
class Entry:
    """A reproduction: its name, the paper, the table or figure, and the module whose
    `reproduce(ctx) -> Outcome` runs it."""

    name: str
    paper: str
    figure: str
    module: str

    def load(self) -> Callable[[Context], Outcome]:
        return importlib.import_module(self.module).reproduce


REPRODUCTIONS: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry(
            "mooncake_cache",
            "Mooncake (FAST 2025, Qin et al.)",
            "Table 2 (prefix cache hit ratios) and Fig. 9 (hit rate against cache capacity)",
            "framework.studies.reproductions.mooncake_cache",
        ),
        Entry(
            "vllm_batching",
            "vLLM / PagedAttention (SOSP 2023, Kwon et al.)",
            "Fig. 13 (mean batched requests), Fig. 2 (KV memory shares), Fig. 12 (sustainable "
            "rates)",
            "framework.studies.reproductions.vllm_batching",
        ),
        Entry(
            "vllm_preemption",
            "vLLM / PagedAttention (SOSP 2023, Kwon et al.)",
            "Fig. 19 (swapping against recomputation across block sizes: the microbenchmark "
            "and end to end)",
            "framework.studies.reproductions.vllm_preemption",
        ),
        Entry(
            "vllm_sharing",
            "vLLM / PagedAttention (SOSP 2023, Kwon et al.)",
            "Fig. 15 (memory saved by sharing among a request's samples and beams) and Fig. "
            "14 (sustainable rates of parallel sampling)",
            "framework.studies.reproductions.vllm_sharing",
        ),
        Entry(
            "sarathi_capacity",
            "Sarathi-Serve (OSDI 2024, Agrawal et al.)",
            "Fig. 10 / artifact figure-5-6 (capacity of Mistral-7B under strict and relaxed "
            "SLOs, vLLM, Orca, Sarathi-Serve) and the abstract's 2.6x",
            "framework.studies.reproductions.sarathi_capacity",
        ),
        Entry(
            "distserve_toy",
            "DistServe (OSDI 2024, Zhong et al.), its blog post",
            "Figure 6 (colocated against 2P1D goodput per GPU, OPT-13B on A100-80GB)",
            "framework.studies.reproductions.distserve_toy",
        ),
        Entry(
            "sglang_offline",
            "SGLang 0.3 against vLLM 0.6 (SGLang's repository, benchmark/benchmark_vllm_060)",
            "offline throughput of Llama 3.1 8B on one A100-80GB and 70B on four H100s, "
            "ShareGPT, 5,000 prompts",
            "framework.studies.reproductions.sglang_offline",
        ),
    ]
}


def entry(name: str) -> Entry:
    """The reproduction called `name`; an unknown name is the user's mistake."""
    found = REPRODUCTIONS.get(name)
    if found is None:
        raise UserError(
            f"unknown reproduction {name!r}; choose from {', '.join(sorted(REPRODUCTIONS))} "
            "(python -m experiments.reproduce --list)"
        )
    return found
