"""Prefix-aware routing, after SGLang's cache-aware router (sgl-router, `cache_aware`).

The rule, for each arriving request:
1. Load is each replica's outstanding requests (waiting and running). The cluster is
   *imbalanced* when both `max - min > router.balance_abs` and `max > router.balance_rel x
   min` (SGLang's two thresholds, here 64 requests and 1.5x by default). Then the request
   goes to the least loaded replica, whatever it has cached.
2. Otherwise the replica whose prefix cache holds the longest leading part of the prompt
   (`ReplicaView.cached_prefix`, whole blocks) gets it, if that part covers at least
   `router.min_match` of the prompt (default 0.3).
3. Otherwise the least loaded replica (fewest outstanding requests; among equals the most
   free KV blocks, then the lowest index).

Where it differs from SGLang: SGLang matches against an approximate radix tree of the
prompts it has routed, here the replicas' own caches are read exactly (what a simulator can
do); and SGLang sends a request below the threshold to the replica with the smallest tree,
here to the least loaded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from framework.api import ClusterView, Replica, RequestSpec, Router, RouterConfig, hookimpl


@dataclass
class PrefixAwareConfig(RouterConfig):
    min_match: float = 0.3  # the cached share of the prompt that wins a request
    balance_abs: int = 64  # imbalanced when max - min outstanding exceeds this ...
    balance_rel: float = 1.5  # ... and max exceeds this times min


class PrefixAwareRouter(Router):
    def __init__(self, cfg: PrefixAwareConfig) -> None:
        super().__init__(cfg)
        if not 0 <= cfg.min_match <= 1:
            raise ValueError(f"router.min_match must be in [0, 1]; got {cfg.min_match}")
        if cfg.balance_abs < 0:
            raise ValueError(f"router.balance_abs must be >= 0; got {cfg.balance_abs}")
        if cfg.balance_rel < 1:
            raise ValueError(f"router.balance_rel must be >= 1; got {cfg.balance_rel}")
        self.cfg: PrefixAwareConfig = cfg

    def route(self, view: ClusterView, request: RequestSpec) -> int:
        loads = [r.outstanding for r in view.replicas]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.cfg.balance_abs and hi > self.cfg.balance_rel * lo:
            return least_loaded(view.replicas)
        prompt = len(request.prompt_token_ids)
        best = max(view.replicas, key=lambda r: (r.cached_prefix(request), -r.index))
        if prompt and best.cached_prefix(request) >= self.cfg.min_match * prompt > 0:
            return best.index
        return least_loaded(view.replicas)


def least_loaded(replicas: Sequence[Replica]) -> int:
    return min(replicas, key=lambda r: (r.outstanding, -r.blocks_free, r.index)).index


@hookimpl
def register_routers(register) -> None:  # type: ignore[no-untyped-def]
    register("prefix_aware", PrefixAwareRouter, PrefixAwareConfig)
