"""Random: each request to a replica drawn uniformly from `router.seed`'s stream, so a run is
reproducible; the load it sees is binomial, not balanced."""

from __future__ import annotations

import random
from dataclasses import dataclass

from framework.api import ClusterView, RequestSpec, Router, RouterConfig, hookimpl


@dataclass
class RandomConfig(RouterConfig):
    pass


class RandomRouter(Router):
    def __init__(self, cfg: RandomConfig) -> None:
        super().__init__(cfg)
        self.draw = random.Random(cfg.seed)

    def route(self, view: ClusterView, request: RequestSpec) -> int:
        return self.draw.randrange(len(view))


@hookimpl
def register_routers(register) -> None:  # type: ignore[no-untyped-def]
    register("random", RandomRouter, RandomConfig)
