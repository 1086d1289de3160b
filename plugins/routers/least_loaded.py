"""Two load-balancing routers that read every replica, the lowest index among equals:

- `least_outstanding`: fewest requests waiting and running (join-shortest-queue, as Vidur's
  and SplitwiseSim's `lor`/`jsq` global schedulers);
- `least_tokens`: fewest outstanding tokens (prompt tokens still to compute plus tokens still
  allowed to generate), which weighs a long prompt as the work it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import ClusterView, RequestSpec, Router, RouterConfig, hookimpl


@dataclass
class LeastOutstandingConfig(RouterConfig):
    pass


@dataclass
class LeastTokensConfig(RouterConfig):
    pass


class LeastOutstandingRouter(Router):
    def route(self, view: ClusterView, request: RequestSpec) -> int:
        return min(view.replicas, key=lambda r: (r.outstanding, r.index)).index


class LeastTokensRouter(Router):
    def route(self, view: ClusterView, request: RequestSpec) -> int:
        return min(view.replicas, key=lambda r: (r.outstanding_tokens, r.index)).index


@hookimpl
def register_routers(register) -> None:  # type: ignore[no-untyped-def]
    register("least_outstanding", LeastOutstandingRouter, LeastOutstandingConfig)
    register("least_tokens", LeastTokensRouter, LeastTokensConfig)
