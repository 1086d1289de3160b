"""The engine's mutable state for one request: tokens, cache blocks, status and timestamps.

Only the engine mutates a Sequence; policies read it (see `framework.api.policy`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sample_group import sample_specs

if TYPE_CHECKING:
    from framework.core.token_logprob import TokenLogprob


class Status(enum.Enum):
    PENDING = "pending"  # not yet arrived (open loop)
    WAITING = "waiting"  # arrived, queued for admission (again, after a preemption)
    RUNNING = "running"  # holds blocks and a batch row
    FINISHED = "finished"  # owes no more tokens; may still hold a row (static batching)
    RELEASED = "released"  # finished and its blocks are back in the pool
    REJECTED = "rejected"  # can never run here; see `reject_reason`
    # KV that moves between engines (a cluster's hand-offs and failures) is the cluster's
    # business; an engine knows only these two states of it.
    PARKED = "parked"  # holds blocks here outside the running rows while its KV moves
    # (`framework.engine.parking`): leaving, its part here done, or joining, KV arriving
    MOVED = "moved"  # its part here is over though it owes more tokens: blocks released,
    # and a copy of it elsewhere serves the rest (see `handed_on`)


# Finish reasons of a request ended from outside the engine (`Engine.abort`), before its stop
# token or its length: its client went away, or a stop string was found in its text. Neither
# is a stop or length finish, so the end-of-run checks of those do not apply to it.
ABORTED = "abort"
STOP_STRING = "stop_string"
ENDED_OUTSIDE = (ABORTED, STOP_STRING)


@dataclass(eq=False)
class SampleGroup:
    """The samples of one request, in index order (the leader first), and those not yet
    forked. Only the engine's planner moves a sample out of `unforked`."""

    request: RequestSpec
    members: list[Sequence]
    unforked: list[Sequence] = field(default_factory=list)

    @property
    def leader(self) -> Sequence:
        return self.members[0]


@dataclass(eq=False, slots=True)  # identity: two requests with equal fields are still two requests
class Sequence:
    spec: RequestSpec
    eos_token_id: int | None
    status: Status = Status.PENDING
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    # While waiting after a preemption by swap: the host tier's blocks holding the KV of its
    # first `num_computed` tokens (`framework.engine.host_tier`), copied back when it is
    # admitted again; empty otherwise. A request never holds blocks in both tiers at once.
    host_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V is in this sequence's blocks
    num_held: int = 0  # sampled tokens still on the device: in the cache, not yet in the request
    # Positions below this are prefill since the last admission (the prompt, and on a
    # recompute what was generated before the preemption); a chunked prefill is part way
    # while num_computed is below it.
    prefill_end: int = 0
    prefix_published: int = 0  # leading blocks of its table published (prefix caching)
    # While waiting: the leading tokens the prefix cache held when the engine last looked
    # (admission). The forward of an admission now skips them, so they are not charged to
    # the step's token budget (as vLLM's scheduler does); 0 once admitted.
    cached_prefix: int = 0
    finish_reason: str | None = None
    reject_reason: str | None = None
    preemptions: int = 0
    # Output tokens it arrived with from a prefill replica, whose KV came with it (a decode
    # replica's copy of the request): this replica neither computed nor kept them. 0 else.
    carried: int = 0
    # Output tokens it arrived with from a replica that failed (delivered there before the
    # failure, their KV lost with it): this replica computes them again as prefill, as after
    # a preemption, and does not deliver them again. 0 else.
    rerouted: int = 0
    admit_order: int = -1  # monotone admission counter: newest has the largest
    # Seconds since run start; None until it happens.
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    released_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    # A prefix-caching pool's chained hashes of its leading full blocks, computed once each
    # (the tokens of a full block never change) and kept for every later lookup.
    block_hashes: list[bytes] = field(default_factory=list, repr=False)
    # Prefill/decode disaggregation: the output tokens this replica generates before it
    # hands the request on (a prefill replica's: its first); None: all of them.
    hand_off_after: int | None = None
    # One of a request's parallel samples (`framework.core.sample_group`): its group, and
    # which sample it is; None for a request of one sample.
    group: SampleGroup | None = field(default=None, repr=False)
    sample_index: int = 0
    # Log-probabilities where the request asks for them (`framework.engine.scores`): one
    # entry (or None, not scored) per prompt position (position 0 never is) and per output
    # token, by index.
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list, repr=False)
    output_logprobs: list[TokenLogprob | None] = field(default_factory=list, repr=False)
    # Fixed by the spec (and the hand-off), read several times per row per step: set once.
    prompt_len: int = field(init=False, repr=False)
    # The tokens that end this request: its stop ids, and EOS unless it is ignored.
    stop_ids: frozenset[int] = field(init=False, repr=False)
    # The output tokens sampled here before the row needs no more forwards: `max_tokens`,
    # or `hand_off_after` when that is sooner. Every length check on the engine reads it.
    output_limit: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.spec.prompt_token_ids)
        sp = self.spec.sampling
        self.output_limit = sp.max_tokens
        ids = set(sp.stop_token_ids)
        if not sp.ignore_eos and self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        # A beam's search ends its hypotheses on them (`framework.engine.beams`), not a token
        self.stop_ids = frozenset(ids) if sp.beam_width == 1 else frozenset()

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def sampling(self) -> SamplingParams:
        return self.spec.sampling

    @property
    def arrival(self) -> float:
        return self.spec.arrival

    @property
    def priority(self) -> int:
        """The request's priority: lower is more urgent (see `RequestSpec`)."""
        return self.spec.priority

    @property
    def num_tokens(self) -> int:
        """Prompt plus every generated token the host has applied."""
        return self.prompt_len + len(self.output_token_ids)

    @property
    def max_len(self) -> int:
        """The longest this sequence can get: what a worst-case reservation books."""
        return self.prompt_len + self.sampling.max_tokens

    @property
    def remaining(self) -> int:
        return self.sampling.max_tokens - len(self.output_token_ids)

    @property
    def is_prefill(self) -> bool:
        """True when the next forward must compute more than one token for this row."""
        return self.total_len - self.num_computed > 1

    @property
    def total_len(self) -> int:
        """The length the device knows: applied tokens plus tokens held on the device."""
        return self.prompt_len + len(self.output_token_ids) + self.num_held

    @property
    def step_tokens(self) -> int:
        """Tokens the next forward computes for this row (a finished row still costs one)."""
        # `total_len` inlined: summed over every running row several times a step, this is
        # among the engine's hottest lines at trace scale.
        out = len(self.output_token_ids) + self.num_held
        if self.finish_reason is not None or out >= self.output_limit:  # `finished`
            return 1
        return self.prompt_len + out - self.num_computed - self.cached_prefix

    @property
    def finished(self) -> bool:
        """The one test of whether a request is done here: it needs no more forwards, as its
        stop token has been seen, or every token it is owed here has been sampled (a length
        limit is known on the host without reading any value). Apart from it: `num_held`,
        its tokens still on the device; `finish_reason`, why it ended (None while its last
        tokens are on the device); `status`, which queue or book holds it."""
        return self.finish_reason is not None or (
            len(self.output_token_ids) + self.num_held >= self.output_limit
        )

    def stop_here_after(self, tokens: int) -> None:
        """This replica generates at most `tokens` of the request's output, then hands it
        on (a prefill replica: its first token). Every length check reads `output_limit`,
        so the engine treats the row as done here after them."""
        self.hand_off_after = tokens
        self.output_limit = min(self.output_limit, tokens)

    @property
    def hands_off(self) -> bool:
        """Its part here is done though it owes more tokens: handed on, not finished."""
        return (
            self.hand_off_after is not None
            and len(self.output_token_ids) < self.spec.sampling.max_tokens
        )

    @property
    def handed_on(self) -> bool:
        """Moved after every token owed here was delivered (a prefill replica's part, its KV
        sent on), rather than taken away part way (its replica failed): only a request
        handed on has reached its `hand_off_after`."""
        return (
            self.status is Status.MOVED
            and self.hand_off_after is not None
            and len(self.output_token_ids) >= self.hand_off_after
        )

    def copy_for(self, kv_sent: bool) -> Sequence:
        """The request as another replica takes it: the tokens delivered so far and their
        times, its preemptions, admission and first token. `kv_sent`: a decode replica
        receives it from its prefill replica, the prompt's KV computed (it comes over the
        link), nothing to prefill, its own `max_tokens` again; else a live replica takes it
        over from a failed one, nothing computed (its KV was lost with its replica), its
        prompt and those tokens to prefill again."""
        copy = Sequence(self.spec, self.eos_token_id, Status.PARKED if kv_sent else Status.WAITING)
        copy.output_token_ids = list(self.output_token_ids)
        copy.token_times = list(self.token_times)
        copy.prompt_logprobs = list(self.prompt_logprobs)
        copy.output_logprobs = list(self.output_logprobs)
        if kv_sent:
            copy.num_computed = copy.prefill_end = self.num_computed
            copy.carried = len(self.output_token_ids)
        else:
            copy.rerouted = len(self.output_token_ids)
        copy.preemptions = self.preemptions
        copy.admitted_at = self.admitted_at
        copy.first_token_at = self.first_token_at
        return copy

    def all_token_ids(self) -> list[int]:
        return list(self.spec.prompt_token_ids) + self.output_token_ids

    def tokens_from(self, start: int) -> list[int]:
        """The applied tokens from position `start` on, without copying the whole prompt:
        a decode row needs one token, and prompts in real traces run to thousands."""
        p = self.prompt_len
        if start >= p:
            return self.output_token_ids[start - p :]
        return list(self.spec.prompt_token_ids[start:]) + self.output_token_ids

    def tokens_between(self, start: int, end: int) -> list[int]:
        """The applied tokens at positions start..end-1 (a prefill chunk)."""
        p = self.prompt_len
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        head = list(self.spec.prompt_token_ids[start : min(end, p)])
        return head + self.output_token_ids[: max(0, end - p)] if end > p else head


def sequences_for(spec: RequestSpec, eos_token_id: int | None) -> list[Sequence]:
    """The sequences that serve a request: one, or its `n` samples tied by their group
    (`framework.core.sample_group`), the leader first, the others not yet forked."""
    specs = sample_specs(spec)
    seqs = [Sequence(s, eos_token_id) for s in specs]
    if len(seqs) > 1:
        group = SampleGroup(spec, seqs, seqs[1:])
        for i, seq in enumerate(seqs):
            seq.group, seq.sample_index = group, i
    return seqs
