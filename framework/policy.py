"""The policy API (version 1): what a policy may read, what it returns.

Policies decide; the engine mutates. Each policy receives an `EngineView` (read-only by
contract: the queues, the running rows, the pool's free blocks, the limits) and returns a
decision. The engine validates every decision and raises `PolicyError` naming the plugin
when one breaks the contract, so a misbehaving third-party policy is easy to find.

Four groups, one policy of each per run:
- Scheduler: which finished rows leave the batch (`evict`) and who is admitted (`admit`).
- Allocator: how many blocks a sequence needs at admission and before each step.
- Preemption: which running rows give up their blocks when the pool is dry.
- OutputPolicy: when sampled tokens held on the device are brought to the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from framework.sequence import Sequence

API_VERSION = 1


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the contract."""


@dataclass
class PolicyConfig:
    """Base of every policy's options. `name` is the registered name (the config choice)."""

    name: str = ""


@dataclass(frozen=True)
class EngineView:
    """A snapshot of engine state for one decision. Do not mutate what it holds."""

    now: float
    step: int
    waiting: Seq[Sequence]  # arrived, FCFS order (preempted requests at the head)
    running: Seq[Sequence]  # rows of the next forward, admission order; may hold FINISHED rows
    free_blocks: int  # after the running rows' growth for this step is set aside
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    blocks_to_admit: Callable[[Sequence], int]  # the allocator's price of admitting a sequence

    def step_tokens(self) -> int:
        """Tokens the running rows will put in the next forward (prefill rows count whole)."""
        return sum(s.num_tokens - s.num_computed for s in self.running if not s.finished) + sum(
            1 for s in self.running if s.finished
        )


class Scheduler(ABC):
    """Chooses the batch. Called twice per step: `evict` first, then `admit`."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def evict(self, view: EngineView) -> list[Sequence]:
        """Finished rows to release before the forward (a subset of finished running rows)."""

    @abstractmethod
    def admit(self, view: EngineView) -> list[Sequence]:
        """Waiting sequences to admit now, in order. The engine checks every budget again."""


class Allocator(ABC):
    """Prices blocks. The engine does the allocating; this says how many."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def blocks_to_admit(self, seq: Sequence, block_size: int) -> int:
        """Blocks a waiting sequence must be given when admitted."""

    @abstractmethod
    def blocks_to_grow(self, seq: Sequence, block_size: int, lookahead: int) -> int:
        """Extra blocks a running sequence needs before the next forward writes its K/V.

        `lookahead` is how many tokens beyond `seq.num_tokens` are already sampled and
        held on the device: they are in the cache before they are in the request.
        """


class Preemption(ABC):
    """Names the victims when running rows need blocks the pool does not have."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def victims(self, view: EngineView, blocks_short: int) -> list[Sequence]:
        """Running, unfinished sequences to preempt (the engine frees and requeues them).

        The engine calls again while the pool is still short, so returning one victim at a
        time is fine. Returning none while short is an error.
        """


@dataclass(frozen=True)
class OutputView:
    """What an output policy sees when deciding whether to bring held tokens home."""

    step: int
    held_steps: int  # steps whose sampled tokens are still on the device
    rows_changing: bool  # the next batch differs in rows from the held steps' rows
    running: Seq[Sequence]


class OutputPolicy(ABC):
    """Decides when the sampled tokens held on the device are read back to the host."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def should_drain(self, view: OutputView) -> bool:
        """True to bring every held step home now (one concatenation, one transfer)."""


GROUPS: dict[str, type] = {
    "scheduler": Scheduler,
    "allocator": Allocator,
    "preemption": Preemption,
    "output": OutputPolicy,
}
