"""TokenLogprob: one position's log-probability as a request keeps it
(`Sequence.prompt_logprobs`, `Sequence.output_logprobs`; computed by the executor and
delivered by `framework.engine.scores`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One position's token log-probability and its `top` alternatives, most likely first
    (as many as the request asked for), each as (token id, log-probability)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
