"""What a user asks for: a request as it enters the engine, before any scheduling state.

Kept apart from `sequence.Sequence` (the engine's mutable state) so that workloads, the
CLI and tests can build requests without touching engine internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The penalties' values that change nothing (OpenAI's and vLLM's defaults): a request whose
# penalties all equal them is not penalized. The server and the batch config read them too.
NEUTRAL_PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens.

    `temperature == 0` means greedy. `seed` makes sampling reproducible per request: each
    token's draw depends only on (seed, token index), never on what else shares the batch.
    `n` > 1 asks for that many samples of one prompt (parallel sampling): the engine runs
    them as sequences over one copy of the prompt's KV (`framework.core.sample_group`),
    each drawing from a seed stream of its own, the first from `seed` itself.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely (0: none)
    seed: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # True forces exactly max_tokens (trace replay)
    n: int = 1  # samples of the prompt
    # Log-probabilities read back with the tokens (`framework.engine.scores`): None asks
    # for none; k >= 0 for each sampled token's and its k most likely alternatives';
    # `prompt_logprobs` the same for every prompt token after the first (its prompt is
    # then computed whole, never taken from the prefix cache).
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Beam search (`framework.engine.beams`): `beam_width` > 1 beams over shared blocks,
    # greedy; the hypotheses ranked by cumulative log-probability / length ** length_penalty.
    beam_width: int = 1
    length_penalty: float = 1.0
    # Penalties on tokens the sequence already has, as OpenAI and vLLM define them: each
    # output token's logit less `presence_penalty` once and `frequency_penalty` per time it
    # was sampled; a prompt or output token's logit divided (if positive) or multiplied by
    # `repetition_penalty`. Neutral: 0, 0, 1. Applied on the device
    # (`framework.executors.penalties`); log-probabilities stay the model's own.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # No stop token (EOS unless ignored, `stop_token_ids`) among the first `min_tokens`
    # output tokens: they are masked out of the draw.
    min_tokens: int = 0
    # Whether a penalty applies; whether the logits are changed before the draw (a penalty,
    # or `min_tokens`): read for every row of every step, so set once.
    penalized: bool = field(init=False, repr=False, compare=False, default=False)
    shaped: bool = field(init=False, repr=False, compare=False, default=False)
    # Whether each output token's log-probabilities are computed (`scored_top` is not None):
    # read for every row of every step, so set once.
    scored: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"sampling.min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"sampling.n must be an integer >= 1, got {self.n!r}")
        w = self.beam_width
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"sampling.beam_width must be an integer >= 1, got {w!r}")
        if self.beam_width > 1 and self.temperature > 0:
            raise ValueError("sampling.beam_width > 1 searches greedily: temperature must be 0")
        if self.beam_width > 1 and self.n > self.beam_width:
            raise ValueError(
                f"sampling.n={self.n} beams returned of beam_width={self.beam_width}: n must "
                "be <= beam_width"
            )
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
                raise ValueError(f"sampling.{name} must be None or an integer >= 0, got {k!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"sampling.{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError(
                f"sampling.repetition_penalty must be > 0 (1: none), got {self.repetition_penalty}"
            )
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= self.max_tokens:
            raise ValueError(f"sampling.min_tokens must be an integer in [0, max_tokens]: {m!r}")
        penalized = any(getattr(self, k) != v for k, v in NEUTRAL_PENALTIES.items())
        if self.beam_width > 1 and (penalized or m):
            raise ValueError(
                "sampling.beam_width > 1 ranks the model's own log-probabilities: no penalties "
                "and no min_tokens"
            )
        object.__setattr__(self, "penalized", penalized)
        object.__setattr__(self, "shaped", penalized or m > 0)
        object.__setattr__(self, "scored", self.scored_top is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def sequences(self) -> int:
        """The sequences the engine runs for the request: its samples, or its beams."""
        return self.beam_width if self.beam_width > 1 else self.n

    @property
    def scored_top(self) -> int | None:
        """The alternatives each output token's log-probabilities carry (None: none): what
        was asked for, and for a beam at least the 2 x beam_width its search chooses from."""
        if self.beam_width > 1:
            return max(self.logprobs or 0, 2 * self.beam_width)
        return self.logprobs


@dataclass
class RequestSpec:
    """One request of a workload: a prompt (token ids), what to sample, and when it arrives.

    `arrival` is seconds after the run starts; a request is invisible to the scheduler
    before then (open loop). `prompt` keeps the text, when there was one, for reports.
    `priority` orders requests for priority-aware policies: lower is more urgent (as in
    vLLM), any integer, 0 by default. Policies that ignore it (FCFS, SJF) treat every
    request alike.
    """

    id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival: float = 0.0
    prompt: str | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(
                f"request {self.id!r}: priority must be an integer, got {self.priority!r}"
            )
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.id!r}: prompt_token_ids must not be empty")
        if self.arrival < 0:
            raise ValueError(f"request {self.id!r}: arrival must be >= 0, got {self.arrival}")
