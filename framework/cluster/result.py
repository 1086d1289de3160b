"""A cluster run's result: one engine's `RunResult`, its replicas' merged (totals under the
same keys as one engine's), with what only a cluster has: which replica served each request
and ran each step, each replica's own result, and with prefill/decode disaggregation the
roles, the decode replica of each request handed off, every KV transfer and the link; after
a replica's failure each request's replicas in placement order and the outages. A single
engine's result carries none of these, so nothing about one engine reads as a cluster's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from framework.cluster.link import TransferRecord
from framework.cluster.outages import OutageRecord
from framework.engine.loop import RunResult


@dataclass
class ClusterResult(RunResult):
    """The merged result of a cluster's replicas (`framework.run.cluster_run.merge`)."""

    replica_of: dict[str, int] = field(default_factory=dict)  # by request id
    step_replicas: list[int] = field(default_factory=list)  # the replica of each merged step
    replicas: list[RunResult] = field(default_factory=list)  # each replica's own
    # With replica roles: each replica's; with prefill replicas also each handed-off
    # request's decode replica, every KV transfer, and the link they crossed.
    roles: list[str] | None = None
    decode_of: dict[str, int] | None = None
    transfers: list[TransferRecord] | None = None
    link: dict[str, Any] | None = None
    # Each request's replicas in placement order (more than one after a failure took it),
    # and the outages as they happened (`cluster.faults`; None without).
    replicas_of: dict[str, list[int]] | None = None
    outages: list[OutageRecord] | None = None
