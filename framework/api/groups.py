"""The policy groups, each with the base class its policies subclass: the four of one engine
and the router of a cluster (`framework.api.router`)."""

from __future__ import annotations

from framework.api.policy import Allocator, OutputPolicy, Preemption, Scheduler
from framework.api.router import Router

GROUPS: dict[str, type] = {
    "scheduler": Scheduler,
    "allocator": Allocator,
    "preemption": Preemption,
    "output": OutputPolicy,
    "router": Router,
}
