"""Random but reproducible load: length distributions and an arrival process.

The parameterisation is documented on `SyntheticWorkloadConfig`. One seed drives everything,
split with `SeedSequence.spawn` into independent streams for prompt lengths, output lengths,
arrivals and prompt text, so changing, say, the arrival process leaves the lengths alone.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.workloads.common import (
    request_id,
    require_at_least,
    require_choice,
    require_positive,
    sampling_for,
)
from framework.workloads.config import SyntheticWorkloadConfig
from framework.workloads.text import exact_length_prompts

LENGTH_DISTS = ("fixed", "uniform", "lognormal")
ARRIVALS = ("poisson", "gamma", "burst")


def sample_lengths(
    rng: np.random.Generator,
    n: int,
    *,
    prefix: str,
    dist: str,
    mean: int,
    low: int,
    high: int,
    cv: float,
) -> np.ndarray:
    """`n` token counts; `prefix` ("prompt_len" / "output_len") names the fields in errors."""
    require_choice(f"{prefix}_dist", dist, LENGTH_DISTS)
    require_at_least(f"{prefix}_mean", mean, 1)
    require_at_least(f"{prefix}_min", low, 1)
    if high < low:
        raise ValueError(
            f"workload.{prefix}_max must be >= workload.{prefix}_min ({low}); got {high}"
        )
    if dist == "fixed":
        return np.full(n, mean, dtype=np.int64)
    if dist == "uniform":
        return rng.integers(low, high, size=n, endpoint=True)
    require_positive(f"{prefix}_cv", cv)
    # Lognormal with arithmetic mean m and cv c: sigma^2 = ln(1 + c^2), mu = ln(m) - sigma^2/2.
    sigma = np.sqrt(np.log1p(cv**2))
    mu = np.log(mean) - sigma**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), low, high).astype(np.int64)


def sample_arrivals(
    rng: np.random.Generator, n: int, *, process: str, rate: float, cv: float
) -> np.ndarray:
    """Arrival times in seconds, starting at 0 so a run never opens with idle time."""
    require_choice("arrival", process, ARRIVALS)
    require_positive("rate", rate)
    if process == "burst":
        return np.zeros(n)
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n - 1)
    else:
        require_positive("cv", cv)
        shape = 1.0 / cv**2  # gamma with shape k has cv 1/sqrt(k); scale sets the mean
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _streams(cfg: SyntheticWorkloadConfig) -> list[np.random.Generator]:
    """Independent generators for prompt lengths, output lengths, arrivals and text."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4)]


def synthetic_shape(cfg: SyntheticWorkloadConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths, arrivals): every field checked, no tokenizer needed,
    so a bad value (a rate of 0, say) is reported before any model loads."""
    require_at_least("num_requests", cfg.num_requests, 1)
    n = cfg.num_requests
    prompt_rng, output_rng, arrival_rng, _ = _streams(cfg)
    prompt_lens = sample_lengths(
        prompt_rng,
        n,
        prefix="prompt_len",
        dist=cfg.prompt_len_dist,
        mean=cfg.prompt_len_mean,
        low=cfg.prompt_len_min,
        high=cfg.prompt_len_max,
        cv=cfg.prompt_len_cv,
    )
    output_lens = sample_lengths(
        output_rng,
        n,
        prefix="output_len",
        dist=cfg.output_len_dist,
        mean=cfg.output_len_mean,
        low=cfg.output_len_min,
        high=cfg.output_len_max,
        cv=cfg.output_len_cv,
    )
    arrivals = sample_arrivals(arrival_rng, n, process=cfg.arrival, rate=cfg.rate, cv=cfg.cv)
    return prompt_lens, output_lens, arrivals


def build_synthetic(
    cfg: SyntheticWorkloadConfig, tokenizer: PreTrainedTokenizerBase
) -> list[RequestSpec]:
    """`num_requests` requests with sampled lengths (EOS ignored) and arrivals."""
    prompt_lens, output_lens, arrivals = synthetic_shape(cfg)
    text_rng = _streams(cfg)[3]
    prompts = exact_length_prompts(tokenizer, prompt_lens.tolist(), text_rng)
    return [
        RequestSpec(
            id=request_id(i),
            prompt_token_ids=ids,
            sampling=sampling_for(cfg, i, max_tokens=int(output_len), ignore_eos=True),
            arrival=float(arrival),
            prompt=text,
        )
        for i, ((ids, text), output_len, arrival) in enumerate(
            zip(prompts, output_lens, arrivals, strict=True)
        )
    ]
