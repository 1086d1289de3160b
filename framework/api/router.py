"""The fifth policy group: a router sends each arriving request to one replica of a cluster.

A cluster (`cluster.replicas=N`) is N whole engines, each with its own KV pool and its own
scheduler, allocator, preemption and output policies, behind one router. A request reaches
the router at its arrival time; the router reads a `ClusterView` (one read-only
`ReplicaView` per replica, as each stands at that moment) and returns the index of the
replica that serves it. The cluster checks the decision: an index out of range, or anything
that is not an int, is a `PolicyError` naming the router.

Registering is as for the other groups: a plugin module implements
`register_routers(register)` and calls `register(name, RouterClass, ConfigClass)`; the
config's fields are the router's options (`router.<field>=...`). A router with a seed reads
`cfg.seed` (every router config has one: the run's `seed` unless set apart).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from framework.api.policy import PolicyConfig

if TYPE_CHECKING:
    from framework.core.request import RequestSpec
    from framework.core.sequence import Sequence


@dataclass
class RouterConfig(PolicyConfig):
    seed: int = 0  # routers that draw at random draw from this seed
    # With prefill replicas (`cluster.roles`): the router policy that picks each request's
    # decode replica, after its prefill; null: a second instance of this one, same options.
    decode: str | None = None


class Replica(Protocol):
    """What a router reads of one replica, whichever form it comes in: a `ReplicaView` of
    an engine in this process, or a `ReplicaState` taken of one in another."""

    @property
    def index(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def decode_tokens(self) -> int: ...
    @property
    def outstanding_tokens(self) -> int: ...
    @property
    def blocks_used(self) -> int: ...
    @property
    def blocks_free(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    def cached_prefix(self, request: RequestSpec) -> int: ...


class _Pool(Protocol):
    @property
    def num_used(self) -> int: ...
    @property
    def num_free(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    def cached_prefix(self, token_ids: Seq[int]) -> int: ...


class Replicated(Protocol):
    """What a `ReplicaView` reads of a replica in this process (an engine has all of it):
    its queues, the requests parked to join its rows once their KV has landed (`joining`)
    and its pool. The contract names these, not the engine."""

    @property
    def pending(self) -> Collection[Sequence]: ...
    @property
    def waiting(self) -> Seq[Sequence]: ...
    @property
    def running(self) -> Seq[Sequence]: ...
    @property
    def joining(self) -> Seq[Sequence]: ...
    @property
    def pool(self) -> _Pool: ...


class ReplicaView:
    """How the cluster reads one replica in this process, read-only, to take the snapshot a
    router is given (`snapshot`): every figure computed when asked."""

    __slots__ = ("_engine", "index")

    def __init__(self, index: int, engine: Replicated) -> None:
        self.index = index
        self._engine = engine

    @property
    def waiting(self) -> int:
        """Requests routed here and not running: not yet arrived at its clock, or queued;
        on a decode replica also those whose KV is on its way here or has landed."""
        e = self._engine
        return len(e.pending) + len(e.waiting) + len(e.joining)

    @property
    def running(self) -> int:
        """Rows of its next forward (finished rows a static batch keeps included)."""
        return len(self._engine.running)

    @property
    def outstanding(self) -> int:
        """Requests it holds that are not finished: waiting and running."""
        return self.waiting + sum(1 for s in self._engine.running if not s.finished)

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens it still has to compute: the waiting requests' whole prompts and
        what the running rows have left of theirs."""
        e = self._engine
        queued = sum(s.prompt_len for s in e.pending) + sum(
            max(0, s.num_tokens - s.num_computed) for s in e.waiting
        )
        return queued + sum(
            max(0, s.prompt_len - s.num_computed) for s in e.running if not s.finished
        )

    @property
    def decode_tokens(self) -> int:
        """Tokens it may still generate: each unfinished request's `max_tokens` less what it
        has generated (an upper bound: a request may stop early)."""
        e = self._engine
        held = [
            *e.pending,
            *e.waiting,
            *e.joining,
            *(s for s in e.running if not s.finished),
        ]
        return sum(max(0, s.sampling.max_tokens - len(s.output_token_ids)) for s in held)

    @property
    def outstanding_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @property
    def blocks_used(self) -> int:
        return self._engine.pool.num_used

    @property
    def blocks_free(self) -> int:
        """Free blocks, cached-and-evictable ones included (both can be handed out)."""
        return self._engine.pool.num_free

    @property
    def num_blocks(self) -> int:
        return self._engine.pool.num_blocks

    def cached_prefix(self, request: RequestSpec) -> int:
        """Leading prompt tokens of `request` its prefix cache holds now (whole blocks; 0
        when its allocator caches nothing)."""
        return self._engine.pool.cached_prefix(request.prompt_token_ids)


@dataclass(frozen=True)
class ReplicaState:
    """The same figures as `ReplicaView`, taken at one moment for one request: what a router
    reads of every replica, in this process (`snapshot`) or another (`cluster.backend=ray`)."""

    index: int
    waiting: int
    running: int
    outstanding: int
    prefill_tokens: int
    decode_tokens: int
    blocks_used: int
    blocks_free: int
    num_blocks: int
    prefix: int  # `cached_prefix` of the request being routed

    @property
    def outstanding_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    def cached_prefix(self, request: RequestSpec) -> int:
        return self.prefix

    @classmethod
    def of(cls, view: ReplicaView, request: RequestSpec) -> ReplicaState:
        return cls(
            view.index, view.waiting, view.running, view.outstanding, view.prefill_tokens,
            view.decode_tokens, view.blocks_used, view.blocks_free, view.num_blocks,
            view.cached_prefix(request),
        )  # fmt: skip


@dataclass(frozen=True)
class ClusterView:
    """The cluster when a request arrives: `now` (the arrival time, seconds), and the
    replicas in index order."""

    now: float
    replicas: Seq[Replica]

    def __len__(self) -> int:
        return len(self.replicas)


class Router(ABC):
    """Chooses the replica that serves each request."""

    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def route(self, view: ClusterView, request: RequestSpec) -> int:
        """The index (0..len(view) - 1) of the replica that serves `request`."""


def snapshot(now: float, views: Seq[ReplicaView], request: RequestSpec) -> ClusterView:
    """The cluster as a router reads it when `request` arrives: each replica's figures
    taken now, as plain data (`ReplicaState`), whether it runs in this process or not."""
    return ClusterView(now=now, replicas=tuple(ReplicaState.of(v, request) for v in views))
