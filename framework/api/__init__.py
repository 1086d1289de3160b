"""The plugin contract, in one import: everything a policy or observer plugin needs.

    from framework.api import hookimpl, Scheduler, PolicyConfig, EngineView, admit_in_order

Policy API version 2 (`API_VERSION`). The modules behind it:
- `policy`: the four policy base classes, their views and `PolicyError` (the contract);
- `router`: the fifth group, a cluster's router, and its views of the replicas;
- `hookspecs`: the pluggy hooks, `register_*` and the observer hooks;
- `admission`: the shared admission loop under the engine's budgets;
- `registry`: how entry points become named policies (and their Hydra configs);
- `compat`: loading a plugin written for API 1 (or telling it what to change);
- `guard`, `faults`: naming the plugin when a policy or observer raises.

What a plugin reads of the engine's state (`Sequence`, `Status`, `RequestSpec`,
`SamplingParams`, `StepStats`) is re-exported here, so a plugin never imports from the
engine's own modules, which may move.
"""

from framework.api.admission import OrderKey, admit_fcfs, admit_in_order, chunk_prefill, room_for
from framework.api.hookspecs import PROJECT, hookimpl, hookspec
from framework.api.policy import (
    API_VERSION,
    Allocator,
    EngineView,
    OutputPolicy,
    OutputView,
    PolicyConfig,
    PolicyError,
    Preemption,
    PreemptionCosts,
    QueueView,
    Scheduler,
)
from framework.api.preempting import MODE_SETTINGS, check_mode, choose_mode
from framework.api.router import ClusterView, Replica, ReplicaView, Router, RouterConfig
from framework.core.cached_block import CachedBlock
from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import Sequence, Status
from framework.core.step_stats import PHASES, StepStats

__all__ = [
    "API_VERSION",
    "MODE_SETTINGS",
    "PHASES",
    "PROJECT",
    "Allocator",
    "CachedBlock",
    "ClusterView",
    "EngineView",
    "OrderKey",
    "OutputPolicy",
    "OutputView",
    "PolicyConfig",
    "PolicyError",
    "Preemption",
    "PreemptionCosts",
    "QueueView",
    "Replica",
    "ReplicaView",
    "RequestSpec",
    "Router",
    "RouterConfig",
    "SamplingParams",
    "Scheduler",
    "Sequence",
    "Status",
    "StepStats",
    "admit_fcfs",
    "admit_in_order",
    "check_mode",
    "choose_mode",
    "chunk_prefill",
    "hookimpl",
    "hookspec",
    "room_for",
]
