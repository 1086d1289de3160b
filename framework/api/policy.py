"""The policy API, version 2 (`API_VERSION`): what a policy may read, what it returns, and
what happens when a decision breaks the contract. Third-party plugins build on this module
and on `framework.api.hookspecs`; nothing else in `framework/` is part of the contract.

Policies decide; only the engine mutates. A policy receives a view, returns a decision, and
the engine validates the decision before applying it. A policy never allocates or frees a
KV block, moves a request between queues, or appends a token: it names what should happen.

Four groups, one policy of each per run:
- Scheduler: which finished rows leave the batch (`evict`), who is admitted (`admit`); and,
  each a method with a default, how much of a prefill each forward computes (`chunk`:
  chunked prefill) and which running rows make room for a waiting one (`displace`).
- Allocator: how many blocks a sequence needs at admission and before each step; and, each
  with a default, whether it declines an admission that fits (`admits`), whether the pool
  caches shared prefixes (`caches_prefixes`) and which cached block goes first
  (`choose_eviction`).
- Preemption: which running rows give up their blocks when the pool is dry.
- OutputPolicy: how long sampled tokens stay on the device before they are read back.

Registering (see `framework.api.hookspecs` and `framework.plugin_host.registry`)
    A plugin is a module that an entry point of the `nanoserve` group names. It implements
    `register_schedulers(register)` (or `register_allocators`, `register_preemptions`,
    `register_outputs`) and calls `register(name, PolicyClass, ConfigClass)`: the class
    subclasses its group's base below, the config is a dataclass subclassing `PolicyConfig`.
    The config's fields are the policy's options (`scheduler.<field>=...` on the command
    line); Hydra checks their types when it composes the config, and the policy's
    `__init__(cfg)` gets a typed instance (do range checks there and raise ValueError naming
    `group.field`). Names are unique per group across every installed plugin. A module may
    declare `NANOSERVE_API = 2`; a plugin written for another version is reported and
    skipped, not loaded (one written for version 1 is loaded when it uses nothing that
    version 2 renamed, `RENAMED_IN_2`, and otherwise told what to write instead).

What a policy may read
    `EngineView` (schedulers, preemption): `now` and `step`; the queues, `waiting` (arrived
    and not running: FCFS, preempted requests at the head) and `running` (the rows of the
    next forward in admission order, finished rows included while the scheduler keeps
    them); `free_blocks` (after this step's growth of the running rows is set aside),
    `block_size`, `num_blocks`; the budgets `max_num_seqs` and `max_num_batched_tokens`;
    `blocks_to_admit(seq)`, the allocator's price; `step_tokens()`, the running rows' tokens
    (their chosen chunks, in the admission view); `chunk(seq, budget)`, what the
    scheduler's `chunk` gives a sequence; `cached_tokens(seq)`, how much of it the prefix
    cache holds; `admits(seq, free_blocks)`, whether the allocator lets it in. A view only
    reads: what a lookup finds for a sequence (a waiting request's cached prefix, which its
    `step_tokens` then leaves out) the engine records.
    Each `Sequence`, read-only: `id`, `priority` (lower is more urgent), `arrival`,
    `sampling` (`max_tokens`, temperature, ...), `spec` (the `RequestSpec`, prompt included),
    the lengths `prompt_len`, `num_tokens`, `num_computed`, `step_tokens`, `remaining`,
    `output_token_ids`, `block_table` (the blocks it holds), `admit_order` (larger is newer),
    `preemptions`, `status`, `finished`, and the timestamps `admitted_at`, `first_token_at`.
    `OutputView` (output policies) carries measured costs: `transfer_s` (one host
    readback) and `row_s` (one more decode row in a forward). Any plugin may also watch each
    step's measured counts and phase times through the observer hook `on_step_end`.

What a policy returns, and what the engine checks
    - `Scheduler.evict`: finished running rows only.
    - `Scheduler.admit`: waiting sequences, each once, that fit with the running rows within
      `max_num_seqs`, `max_num_batched_tokens` and the free blocks at the allocator's price.
      Admitting nothing while the engine is idle and requests wait is an error too.
    - `Scheduler.chunk`: 1..`seq.step_tokens` tokens, the step within
      `max_num_batched_tokens` (chunked prefill; see the method).
    - `Scheduler.displace`: unfinished running rows.
    - `Allocator.admits`: a scheduler must not admit what the allocator declines
      (`admit_in_order` asks it through `view.admits`; the engine checks).
    - `Allocator.choose_eviction`: one of the evictable cached blocks it was given.
    - `Allocator.blocks_to_admit` / `blocks_to_grow`: at least enough blocks for the tokens
      the sequence will have in its cache.
    - `Preemption.victims`: unfinished running rows, at least one while the pool is short.
    - `OutputPolicy.keep`: between 0 and the number of held steps.
    A decision that breaks these raises `PolicyError("<group> policy '<name>': <what>")`.
    Names are unique per group, so the name identifies the plugin (an unknown name on the
    command line lists every name with the distribution providing it). Blocks
    move only through the engine's `BlockPool`, which refuses a second owner and a free by
    a non-owner (`BlockPoolError`), and the invariant checks at every step catch state
    changed behind the engine's back.

Versioning
    `API_VERSION` changes when a change can break an existing plugin: a removed or renamed
    view field, a changed meaning, a new abstract method. Additions (a view field, an
    optional method with a default) keep the version.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, overload

if TYPE_CHECKING:
    from framework.core.cached_block import CachedBlock
    from framework.core.sequence import Sequence

API_VERSION = 2

# What API 2 renamed of API 1's view, and what a plugin writes instead. A module that
# declares `NANOSERVE_API = 1` is loaded when it uses none of these (`registry`), and
# otherwise refused with the line to change. API 1's `Scheduler.chunks_prefill` flag is
# no longer read: overriding `chunk` is what chunks.
RENAMED_IN_2 = {
    "tokens_for": "view.chunk(seq, budget)",
    "allocator_admits": "view.admits(seq, free_blocks)",
    "chunk_rule": "view.chunk(seq, budget)",
    "planned_tokens": "view.step_tokens()",
}


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the contract."""


@dataclass
class PolicyConfig:
    """Base of every policy's options. `name` is the registered name (the config choice)."""

    name: str = ""


class QueueView(Seq["Sequence"]):
    """A read-only view of the engine's waiting deque.

    Made in O(1) each step, where a tuple copy would cost O(queue) every step and make the
    schedule's cost grow with the backlog. Iterating is lazy; indexing near either end is
    cheap (a deque's middle is O(n), as ever).
    """

    __slots__ = ("_queue",)

    def __init__(self, queue: deque[Sequence]) -> None:
        self._queue = queue

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._queue)

    @overload
    def __getitem__(self, index: int) -> Sequence: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sequence]: ...
    def __getitem__(self, index: int | slice) -> Sequence | list[Sequence]:
        if isinstance(index, slice):
            return list(self._queue)[index]
        return self._queue[index]


class ViewRules(Protocol):
    """The engine's answers to the questions a view may be asked. A view built by hand has
    none: then nothing is cached, a chunk is all that is pending, and every admission that
    fits is admitted."""

    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int: ...

    def cached_tokens(self, seq: Sequence) -> int: ...

    def admits(self, view: EngineView, seq: Sequence, free_blocks: int) -> bool: ...

    def preemption_costs(self, seq: Sequence) -> PreemptionCosts | None: ...


@dataclass(frozen=True)
class PreemptionCosts:
    """What preempting a running sequence would cost each way, as the executor predicts it
    (a simulator from its hardware spec; the real model from what it measured): `swap_s`,
    its KV copied to the host tier now and back when it is readmitted; `recompute_s`, its
    computed tokens prefilled again. `host_free_blocks`: the host tier's free blocks now,
    `swap_blocks`: how many the swap takes (more than are free: it cannot swap)."""

    swap_s: float
    recompute_s: float
    swap_blocks: int
    host_free_blocks: int

    @property
    def can_swap(self) -> bool:
        return self.swap_blocks <= self.host_free_blocks


@dataclass(frozen=True)
class EngineView:
    """A snapshot of engine state for one decision. It only reads: what it reports of a
    sequence (its cached prefix, its chunk) the engine looks up and records itself."""

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
    last_step: Any = None  # the previous step's StepStats (measured counts and phase seconds)
    # The engine's side of `chunk`, `cached_tokens` and `admits` (None: a view built by hand).
    rules: ViewRules | None = None
    # The running rows' tokens in the next forward once their chunks are chosen: set in the
    # admission view, where `step_tokens()` returns it.
    planned: int | None = None

    def admits(self, seq: Sequence, free_blocks: int) -> bool:
        """Whether the allocator lets `seq` in with `free_blocks` left after this step's
        earlier admissions (`Allocator.admits`: a watermark, say). `admit_in_order` asks."""
        return True if self.rules is None else self.rules.admits(self, seq, free_blocks)

    def chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens `seq` would compute in the next forward with `budget` tokens of the step
        left: the scheduler's `Scheduler.chunk`, as the engine will ask it. What
        `admit_in_order` charges a waiting request; under a prefix cache, only what it does
        not find cached."""
        return seq.step_tokens if self.rules is None else self.rules.chunk(self, seq, budget)

    def cached_tokens(self, seq: Sequence) -> int:
        """How many of `seq`'s leading tokens the prefix cache holds now (whole blocks, at
        most its length minus one); 0 without a prefix cache. A cache-aware scheduler's
        signal (`scheduler=lpm`). Each call hashes the prompt's blocks: cheap for a few,
        not for every request of a long queue."""
        return 0 if self.rules is None else self.rules.cached_tokens(seq)

    def preemption_costs(self, seq: Sequence) -> PreemptionCosts | None:
        """The predicted costs of preempting running `seq` by swap and by recompute; None
        with no host tier (`engine.host_kv_memory_mb=0`) or on a view built by hand."""
        return None if self.rules is None else self.rules.preemption_costs(seq)

    def step_tokens(self) -> int:
        """Tokens the running rows will put in the next forward: in the admission view,
        their chunks as the scheduler chose them (a prefill served whole counts whole)."""
        if self.planned is not None:
            return self.planned
        return self._running_tokens

    @cached_property
    def _running_tokens(self) -> int:
        """Summed once per view: a view is a snapshot."""
        return sum(s.step_tokens for s in self.running)


class Scheduler(ABC):
    """Chooses the batch. Called twice per step: `evict` first, then `admit`."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    def evict(self, view: EngineView) -> list[Sequence]:
        """Finished rows to release before the forward (a subset of finished running rows).
        Asked before each forward in which some running row has finished (`seq.finished`),
        and only then: with none, there is nothing it may name. By default every finished
        row leaves at once, as continuous batching does; a scheduler that holds them (static
        batching waits for the whole batch) overrides it."""
        return [s for s in view.running if s.finished]

    @abstractmethod
    def admit(self, view: EngineView) -> list[Sequence]:
        """Waiting sequences to admit now, in order. The engine checks every budget again."""

    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        """How many of `seq`'s pending tokens (`seq.step_tokens`: a prompt, or on a recompute
        the prompt and what was generated) the next forward computes, with `budget` tokens
        of the step left. Default: all of them. Overriding it is all chunked prefill takes:
        the engine then serves a request longer than `engine.max_num_batched_tokens` in
        chunks instead of rejecting it up front.

        Asked, in Sarathi's order, for each running row part way through its prefill (after
        every decode row's one token is set aside, in running order), then for each
        sequence `admit` returned (in its order; `admit_in_order` asks the same through
        `view.chunk`). Return 1..seq.step_tokens; the step's total must stay within
        `max_num_batched_tokens`. A row that stops short of its end samples nothing this
        step (no token, no seeded draw, no stop check) and continues in the next forward
        from where it stopped, over the K/V already in its blocks."""
        return seq.step_tokens

    def pause(self, view: EngineView, admitted: list[Sequence]) -> list[Sequence]:
        """Running rows that sit this step out, given the requests it admits (`admitted`,
        already among `view.running`): they compute and sample nothing, and keep their
        blocks. vLLM's first scheduler runs prefills in iterations of their own, so every
        decode row waits while a prefill runs. The step must keep at least one row; a paused
        row's held tokens come home first. Default: none (every running row computes)."""
        return []

    def displace(self, view: EngineView) -> list[Sequence]:
        """Unfinished running rows to preempt now so that a waiting request can be admitted
        (priority scheduling). Called after `evict` and growth, before `admit`; the engine
        preempts them by the preemption policy's mechanism (free blocks, requeue). Default:
        none, so schedulers that never displace need not implement it."""
        return []


class Allocator(ABC):
    """Prices blocks. The engine does the allocating; this says how many."""

    # True asks the engine for a prefix-caching pool (`framework/engine/prefix_cache.py`):
    # full blocks are published under chained hashes once written, and an admitted sequence
    # shares the cached blocks its prompt starts with. The engine then charges
    # `blocks_to_admit` less the hits on blocks another table holds, and starts the row's
    # forward after its cached blocks (`allocator=prefix_cache`).
    caches_prefixes: bool = False
    # The model's context in tokens (`model.max_model_len`, or the model's own), told by the
    # engine before its first step (`set_context`): what a reservation of the longest
    # possible request books.
    max_model_len: int | None = None

    def set_context(self, max_model_len: int) -> None:
        """The engine tells the allocator its model's context once, when it is built."""
        self.max_model_len = max_model_len

    def admits(self, view: EngineView, seq: Sequence, free_blocks: int) -> bool:
        """May `seq` be admitted now, with `free_blocks` free after this step's earlier
        admissions and `view.blocks_to_admit(seq)` its price? An allocator declines here
        what pricing alone cannot say, such as vLLM's watermark (keep a share of the pool
        free for the running rows' growth, so that admitting does not trigger preemption at
        the next step). Default: every admission that fits."""
        return True

    def choose_eviction(self, cached: list[CachedBlock]) -> int:
        """With `caches_prefixes`: the cached block to evict when the pool needs one, given
        the evictable blocks (each a `CachedBlock`: block, depth in its prefix, hits, when
        freed), least recently freed first. Default: the least recently freed, which the
        pool takes in O(1) without asking; an order of one's own costs O(cached blocks) per
        eviction."""
        return cached[0].block

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

    def mode(self, view: EngineView, victim: Sequence) -> str:
        """How `victim` gives its blocks back: `recompute` (freed; its tokens prefilled
        again when readmitted) or `swap` (its KV copied to the host tier and back when
        readmitted: `engine.host_kv_memory_mb`). Asked once per victim, before it is freed;
        `view.preemption_costs(victim)` predicts both. A swap the host tier cannot hold
        falls back to recompute, counted (`swap_fallbacks`)."""
        return RECOMPUTE


RECOMPUTE, SWAP = "recompute", "swap"
PREEMPTION_MODES = (RECOMPUTE, SWAP)


@dataclass(frozen=True)
class OutputView:
    """What an output policy sees after a forward, when deciding how long tokens stay held.

    Every step's sampled tokens are first held on the device. The engine has already drained
    everything if the rows changed; what remains are steps over the same rows.
    """

    step: int
    held_steps: int  # steps whose sampled tokens are on the device, the newest included
    running: Seq[Sequence]
    transfer_s: float | None  # measured seconds of one host readback (None: not measured yet)
    row_s: float | None  # measured seconds one more decode row adds to a forward


class OutputPolicy(ABC):
    """Decides how many of the newest held steps may stay on the device after this step."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def keep(self, view: OutputView) -> int:
        """How many newest steps stay held (0..held_steps); the older ones are brought home
        now in one concatenation and one transfer. 0 reads everything back at once."""

    def window(self) -> float:
        """The window in force (for logs): the most steps this policy lets stay held."""
        return 0.0


def overrides(policy: Any, base: type, name: str) -> bool:
    """Whether `policy` has a `name` of its own rather than `base`'s default. The engine
    skips a default that cannot change anything (a `displace` naming no one, a `chunk` that
    computes everything) and its view; a policy that is no `base` at all counts as one that
    overrides, so it is asked, and fails, as it would have. A guarded policy is looked at
    through its guard."""
    unguarded = getattr(type(policy), "unguarded", None)
    try:
        own = policy.unguarded(name) if unguarded is not None else getattr(policy, name)
    except AttributeError:
        return True
    return getattr(own, "__func__", None) is not getattr(base, name)
