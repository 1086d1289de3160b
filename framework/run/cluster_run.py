"""A cluster run (`cluster.replicas` > 1): its engines and router built from the run's config,
run as one replay (`framework.cluster.group`), and the replicas' results merged into one
`RunResult` whose totals sit under the same keys as one engine's.

Merging: requests in the workload's order, steps in time order (each with its replica),
counters summed, pools added up (`num_blocks` the cluster's blocks, `peak_blocks` the sum of
each replica's own peak: an upper bound of the cluster's simultaneous peak). Each replica's
own result stays in `replicas`, for `metrics.json`'s per-replica list. A request handed off
from a prefill replica to a decode replica is held by both: the merged result keeps the
decode replica's copy, which has all its tokens and times. A request a replica's failure
took (`cluster.faults`) keeps its last replica's copy, which has every token delivered.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.api.router import Router
from framework.cluster.group import Cluster, ReplicaResults
from framework.cluster.handoffs import Disaggregation
from framework.cluster.outages import Outage
from framework.cluster.result import ClusterResult
from framework.core.request import RequestSpec
from framework.core.sequence import Sequence, Status
from framework.engine.counters import Counters
from framework.engine.loop import Engine, RunResult
from framework.engine.step_log import StepLog, merged
from framework.plugin_host.registry import registry


def build_router(cfg: DictConfig) -> tuple[Router, str, str]:
    """The configured router, its name and its provider (for error messages)."""
    reg = registry()
    router_cfg = OmegaConf.create(OmegaConf.to_container(cfg.router, resolve=True))
    router = reg.build("router", router_cfg)
    name = str(cfg.router.name)
    return router, name, reg.get("router", name).provider.label


class ClusterRunner:
    """Runs like an engine (`run`, `partial_result`), over a cluster."""

    def __init__(
        self,
        engines: list[Engine],
        router: Router,
        name: str,
        provider: str,
        roles: list[str] | None = None,
        handoffs: Disaggregation | None = None,
        link: dict[str, Any] | None = None,
        outages: list[Outage] | None = None,
    ) -> None:
        self.engines = engines
        self.cluster = Cluster(engines, router, name, provider, roles, handoffs, outages)
        self.link = link if handoffs is not None else None
        self.specs: list[RequestSpec] = []

    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> RunResult:
        self.specs = specs
        return merge(self.cluster.run(specs, eos_token_id), specs, self.link)

    def partial_result(self) -> RunResult:
        return merge(self.cluster.partial_result(), self.specs, self.link)


def merge(
    result: ReplicaResults, specs: list[RequestSpec], link: dict[str, Any] | None = None
) -> RunResult:
    """The replicas' results as one `RunResult` (see the module's note)."""
    parts = result.replicas
    order = {s.id: i for i, s in enumerate(specs)}
    latest: dict[str, Sequence] = {}  # a request handed off: its decode replica's copy
    for r in parts:
        for s in r.seqs:
            if s.status is Status.MOVED:  # served where it went next
                continue
            if s.carried or s.id not in latest:
                latest[s.id] = s
    seqs = sorted(latest.values(), key=lambda s: order.get(s.id, len(order)))
    steps, step_replicas = merged([StepLog.of(r.steps) for r in parts])
    counters = Counters()
    for f in fields(Counters):
        setattr(counters, f.name, sum(getattr(r.counters, f.name) for r in parts))
    # What the replicas say of their clock and executor: a live one's (a Ray replica lost
    # has no books, and stands in with none of its steps).
    first = next((r for r in parts if r.executor), parts[0])
    return ClusterResult(
        seqs,
        steps,
        counters,
        first.max_num_seqs,
        sum(r.peak_blocks for r in parts),
        sum(r.num_blocks for r in parts),
        clock=first.clock,
        executor=first.executor,
        replica_of=result.replica_of,
        step_replicas=step_replicas,
        replicas=parts,
        roles=result.roles,
        decode_of=result.decode_of,
        transfers=result.transfers,
        link=link,
        replicas_of=result.replicas_of,
        outages=result.outages,
    )
