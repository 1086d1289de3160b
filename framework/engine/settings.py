"""What an engine is built with besides its executor and pool: its budgets (`Limits`) and
its four policies (`Policies`), each named for error messages; and the policies as the engine
calls them, each behind its guard (`GuardedPolicies`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from framework.api.policy import Allocator, OutputPolicy, Preemption, Scheduler
from framework.plugin_host.guard import Guarded

GROUPS = ("scheduler", "allocator", "preemption", "output")


@dataclass
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"engine.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"engine.max_num_seqs ({self.max_num_seqs}): every row costs at least one token"
            )


@dataclass
class Policies:
    scheduler: Scheduler
    allocator: Allocator
    preemption: Preemption
    output: OutputPolicy
    names: dict[str, str]  # group -> registered name, for error messages
    providers: dict[str, str] = field(default_factory=dict)  # group -> plugin distribution


@dataclass
class GuardedPolicies:
    """The four policies as the engine calls them: each behind its `Guarded`, so a crash in a
    plugin is a `PolicyError` naming it, and typed by what it guards. The policies themselves
    are never changed: what they are told (the model's context) they are told by a method."""

    scheduler: Guarded[Scheduler]
    allocator: Guarded[Allocator]
    preemption: Guarded[Preemption]
    output: Guarded[OutputPolicy]
    names: dict[str, str]
    providers: dict[str, str]

    @classmethod
    def of(cls, policies: Policies) -> GuardedPolicies:
        def guard(group: str) -> Any:
            name = policies.names.get(group, "?")
            return Guarded(getattr(policies, group), group, name, policies.providers.get(group))

        return cls(
            scheduler=guard("scheduler"),
            allocator=guard("allocator"),
            preemption=guard("preemption"),
            output=guard("output"),
            names=dict(policies.names),
            providers=dict(policies.providers),
        )

    def use(self, group: str, policy: Any, name: str | None = None) -> None:
        """`policy` takes `group`'s place from the next step on, guarded like the others (a
        study or a test swapping one policy of a built engine)."""
        if group not in GROUPS:
            raise ValueError(f"policy group must be one of {', '.join(GROUPS)}; got {group!r}")
        if name is not None:
            self.names[group] = name
        label = self.names.get(group, "?")
        setattr(self, group, Guarded(policy, group, label, self.providers.get(group)))
