"""Pieces every builder shares: field checks with actionable messages, and sampling params.

Checks live here, not in `SamplingParams`, so that a bad value is reported under the name the
user typed (`workload.temperature`), not the engine's internal one (`sampling.temperature`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from framework.core.request import RequestSpec, SamplingParams
from framework.workloads.config import WorkloadConfig


def require_choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """Reject a value outside a fixed menu, listing the menu so the fix is obvious."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"workload.{name} must be one of {', '.join(allowed)}; got {value!r}")


def require_at_least(name: str, value: float, minimum: float) -> None:
    """Reject a number below `minimum` (lengths, counts, offsets)."""
    if value < minimum:
        raise ValueError(f"workload.{name} must be >= {minimum}; got {value}")


def require_positive(name: str, value: float) -> None:
    """Reject zero and negative numbers where only a positive one makes sense (rates, cvs)."""
    if not value > 0:
        raise ValueError(f"workload.{name} must be > 0; got {value}")


def check_sampling(cfg: WorkloadConfig) -> None:
    """Validate the shared sampling fields once, before any request is built."""
    require_at_least("seed", cfg.seed, 0)  # numpy's seeding refuses negative seeds
    require_at_least("temperature", cfg.temperature, 0)
    require_at_least("top_k", cfg.top_k, 0)
    require_at_least("n", cfg.n, 1)
    require_at_least("beam_width", cfg.beam_width, 1)
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(cfg, name)
        if k is not None:
            require_at_least(name, k, 0)
    if not 0.0 < cfg.top_p <= 1.0:
        raise ValueError(f"workload.top_p must be in (0, 1]; got {cfg.top_p}")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= getattr(cfg, name) <= 2.0:
            raise ValueError(f"workload.{name} must be in [-2, 2]; got {getattr(cfg, name)}")
    require_positive("repetition_penalty", cfg.repetition_penalty)
    require_at_least("min_tokens", cfg.min_tokens, 0)


def sampling_for(
    cfg: WorkloadConfig, index: int, *, max_tokens: int, ignore_eos: bool, **overrides: Any
) -> SamplingParams:
    """Sampling params of request `index`: the workload's defaults, seed `seed + index`.

    `overrides` carries per-request values (a JSONL line's own temperature, say) that win
    over the workload's.
    """
    fields: dict[str, Any] = {
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "seed": cfg.seed + index,
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "n": cfg.n,
        "logprobs": cfg.logprobs,
        "prompt_logprobs": cfg.prompt_logprobs,
        "beam_width": cfg.beam_width,
        "length_penalty": cfg.length_penalty,
        "presence_penalty": cfg.presence_penalty,
        "frequency_penalty": cfg.frequency_penalty,
        "repetition_penalty": cfg.repetition_penalty,
    }
    fields.update(overrides)
    # A request shorter than workload.min_tokens (a trace's) runs to its own length.
    fields.setdefault("min_tokens", min(cfg.min_tokens, fields["max_tokens"]))
    return SamplingParams(**fields)


def request_id(index: int) -> str:
    """Ids follow the workload's own order (r0 is its first entry), not arrival order."""
    return f"r{index}"


def sort_by_arrival(specs: list[RequestSpec]) -> list[RequestSpec]:
    """Stable sort, so requests that arrive together keep the workload's order."""
    return sorted(specs, key=lambda spec: spec.arrival)
