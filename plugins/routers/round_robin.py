"""Round-robin: replica 0, 1, ..., N-1, 0, ... in arrival order, whatever their load. The
baseline of every router comparison (Vidur's and SplitwiseSim's global schedulers have it)."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import ClusterView, RequestSpec, Router, RouterConfig, hookimpl


@dataclass
class RoundRobinConfig(RouterConfig):
    pass


class RoundRobinRouter(Router):
    def __init__(self, cfg: RoundRobinConfig) -> None:
        super().__init__(cfg)
        self.next = 0

    def route(self, view: ClusterView, request: RequestSpec) -> int:
        chosen = self.next % len(view)
        self.next = chosen + 1
        return chosen


@hookimpl
def register_routers(register) -> None:  # type: ignore[no-untyped-def]
    register("round_robin", RoundRobinRouter, RoundRobinConfig)
