"""The simulator check's cases: each workload under the policies it is checked with."""

from __future__ import annotations

import argparse
import dataclasses
import math

from experiments.toolkit.config import REFERENCE, Combo
from framework.core.request import RequestSpec

DEFERRED: Combo = ("continuous", "incremental", "deferred")
SCHEDULERS = ("static", "continuous", "priority", "sjf")
ALLOCATORS = ("worst_case", "incremental")
WORKLOADS = ("straggler", "azure_closed", "azure_open", "tight_pool")
WINDOW = 4  # the deferred case's window


@dataclasses.dataclass(frozen=True)
class Case:
    """One workload under one policy combination: served real once a round, simulated once."""

    workload: str  # straggler, azure_closed, azure_open_0.5, tight_pool, ...
    combo: Combo
    closed: bool  # every request waiting from t=0: the counts must be equal
    extra: tuple[str, ...] = ()  # overrides beyond the combo (the tight pool's size)

    @property
    def name(self) -> str:
        policy = "/".join(self.combo)
        if self.combo[2] == "deferred":
            policy += f"-{WINDOW}"
        return f"{self.workload} {policy}"

    def overrides(self, base: list[str]) -> list[str]:
        s, a, o = self.combo
        window = [f"window={WINDOW}"] if o == "deferred" else []
        return [*base, f"scheduler={s}", f"allocator={a}", f"output={o}", *window, *self.extra]


def policy_combos(quick: bool) -> list[Combo]:
    """The reference first, then every scheduler x allocator with immediate output, then the
    deferred case; `--quick`: the reference, static/worst_case and the deferred case."""
    if quick:
        return [REFERENCE, ("static", "worst_case", "immediate"), DEFERRED]
    grid = [(s, a, "immediate") for s in SCHEDULERS for a in ALLOCATORS]
    return [REFERENCE, *(c for c in grid if c != REFERENCE), DEFERRED]


def closed_cases(args: argparse.Namespace, tight_blocks: int | None) -> list[Case]:
    cases = []
    for workload in ("straggler", "azure_closed"):
        if workload in args.workloads:
            combos = policy_combos(args.quick) if workload in args.matrix_workloads else [REFERENCE]
            cases += [Case(workload, c, True) for c in combos]
    if "tight_pool" in args.workloads:
        cases.append(Case("tight_pool", REFERENCE, True, (f"engine.num_blocks={tight_blocks}",)))
    return cases


def open_cases(args: argparse.Namespace) -> list[Case]:
    if "azure_open" not in args.workloads:
        return []
    return [Case(f"azure_open_{load:g}", REFERENCE, False) for load in args.loads]


def default_tight_blocks(specs: list[RequestSpec], block_size: int, max_num_seqs: int) -> int:
    """A third of the blocks the first `max_num_seqs` requests hold at their full length (what
    a batch would need at once), and never less than the largest request: every request fits
    alone, but not many together, so growing rows run the pool dry and preempt."""
    need = [-(-(len(s.prompt_token_ids) + s.sampling.max_tokens) // block_size) for s in specs]
    return max(max(need), math.ceil(sum(need[:max_num_seqs]) / 3))
