"""Power of two choices (Mitzenmacher): two distinct replicas drawn from `router.seed`'s
stream, the one with fewer outstanding requests wins (the first drawn among equals). Nearly
the balance of reading every replica, for the cost of reading two."""

from __future__ import annotations

import random
from dataclasses import dataclass

from framework.api import ClusterView, RequestSpec, Router, RouterConfig, hookimpl


@dataclass
class PowerOfTwoConfig(RouterConfig):
    pass


class PowerOfTwoRouter(Router):
    def __init__(self, cfg: PowerOfTwoConfig) -> None:
        super().__init__(cfg)
        self.draw = random.Random(cfg.seed)

    def route(self, view: ClusterView, request: RequestSpec) -> int:
        if len(view) == 1:
            return 0
        a, b = self.draw.sample(range(len(view)), 2)
        ra, rb = view.replicas[a], view.replicas[b]
        return b if rb.outstanding < ra.outstanding else a


@hookimpl
def register_routers(register) -> None:  # type: ignore[no-untyped-def]
    register("power_of_two", PowerOfTwoRouter, PowerOfTwoConfig)
