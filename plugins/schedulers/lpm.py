"""Longest prefix match first (SGLang's cache-aware scheduling): the waiting request whose
prompt the prefix cache holds most of is admitted first, so requests that share a prefix run
while its blocks are still cached, instead of in arrival order, which under a small pool
evicts a prefix before its next request comes.

Two guards against what users of such a policy report. A long queue falls back to FCFS
(`scheduler.max_queue`): ranking asks the cache about every waiting request, each lookup
hashing its prompt's blocks, and SGLang does the same past 128. Waiting ages a request
(`scheduler.aging_tokens_per_s`): its rank is its cached tokens plus that many tokens per
second waited, so a cold request, one with nothing cached, is not passed over for ever by a
stream of warm ones. Without a prefix cache (`allocator=prefix_cache`) every request ranks
by waiting time alone: FCFS.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import EngineView, PolicyConfig, Scheduler, Sequence, admit_in_order, hookimpl


@dataclass
class LPMConfig(PolicyConfig):
    # Past this many waiting requests, admit FCFS (ranking them all costs a cache lookup
    # each).
    max_queue: int = 128
    # Tokens of rank a request gains per second it waits (0: pure longest-prefix order,
    # which can starve cold requests).
    aging_tokens_per_s: float = 64.0


class LPMScheduler(Scheduler):
    """Longest cached prefix first (SGLang), aging waiting requests; FCFS past max_queue."""

    def __init__(self, cfg: LPMConfig) -> None:
        super().__init__(cfg)
        if cfg.max_queue < 0:
            raise ValueError(f"scheduler.max_queue must be >= 0, got {cfg.max_queue}")
        if cfg.aging_tokens_per_s < 0:
            raise ValueError(
                f"scheduler.aging_tokens_per_s must be >= 0, got {cfg.aging_tokens_per_s}"
            )
        self.max_queue = cfg.max_queue
        self.aging = cfg.aging_tokens_per_s

    def admit(self, view: EngineView) -> list[Sequence]:
        if len(view.waiting) > self.max_queue:
            return admit_in_order(view)

        def rank(seq: Sequence) -> float:  # smallest first: most cached, longest waited
            waited = max(0.0, view.now - seq.arrival)
            return -(view.cached_tokens(seq) + self.aging * waited)

        return admit_in_order(view, rank)


@hookimpl
def register_schedulers(register) -> None:  # type: ignore[no-untyped-def]
    register("lpm", LPMScheduler, LPMConfig)
