"""What an engine is built with besides its executor and pool: its budgets (`Limits`) and
its four policies (`Policies`), each named for error messages."""

from __future__ import annotations

from dataclasses import dataclass, field

from framework.api.policy import Allocator, OutputPolicy, Preemption, Scheduler


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
