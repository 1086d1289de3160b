"""The request lengths of the vLLM paper's two workloads, as CSVs the `trace` workload replays
under Poisson arrivals (`num_prefill_tokens`, `num_decode_tokens`).

- **ShareGPT**: the shipped first-turn lengths (`sharegpt_v3_lengths.csv`), the pairs vLLM's
  own benchmark keeps (`kept_by_vllm_filter`: both at least 4 tokens, prompt at most 1,024,
  sum at most 2,048), in a seeded random order. They are counted in SmolLM2 tokens (mean
  about 236 in / 217 out), where the paper's OPT tokenizer gave 161.31 / 337.99: a second
  file scales every pair to the paper's means (`scaled_to`), so that what the tokenizer
  changes is measured, not guessed.
- **Alpaca**: not shipped. Drawn from a stated distribution with the paper's means (19.31 in,
  58.45 out): lognormal of a given coefficient of variation, or fixed at the means (cv 0);
  the reproduction runs more than one to show how far the result moves with that choice.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from framework.run.errors import UserError

HEADER = ("num_prefill_tokens", "num_decode_tokens")
MAX_LEN = 2048  # OPT's context: prompt + output at most this


def write_lengths(path: Path, pairs: list[tuple[int, int]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(HEADER)
        out.writerows(pairs)
    return path


def sharegpt_pairs(source: Path, seed: int = 0) -> list[tuple[int, int]]:
    """The kept ShareGPT pairs, shuffled by `seed`."""
    if not source.is_file():
        raise UserError(f"the ShareGPT lengths {source} are not there (../shared/data/traces)")
    with source.open() as f:
        pairs = [
            (int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
            for r in csv.DictReader(f)
            if r["kept_by_vllm_filter"] == "1"
        ]
    order = np.random.default_rng(seed).permutation(len(pairs))
    return [pairs[i] for i in order]


def scaled_to(
    pairs: list[tuple[int, int]], prompt_mean: float, output_mean: float
) -> list[tuple[int, int]]:
    """Every pair scaled so that the means are the given ones (at least 1 token each, the
    sum kept within the context: the few that would pass it lose output tokens)."""
    p = np.array([a for a, _ in pairs], dtype=float)
    o = np.array([b for _, b in pairs], dtype=float)
    prompts = np.maximum(1, np.rint(p * prompt_mean / p.mean())).astype(int)
    outputs = np.maximum(1, np.rint(o * output_mean / o.mean())).astype(int)
    outputs = np.minimum(outputs, MAX_LEN - prompts)
    keep = outputs >= 1
    return list(zip(prompts[keep].tolist(), outputs[keep].tolist(), strict=True))


def drawn_pairs(
    n: int, prompt_mean: float, output_mean: float, cv: float, seed: int = 0
) -> list[tuple[int, int]]:
    """`n` pairs, each length lognormal with the given mean and coefficient of variation
    (cv 0: every pair at the means, rounded), at least 1 token."""
    rng = np.random.default_rng(seed)

    def draw(mean: float) -> np.ndarray:
        if cv <= 0:
            return np.full(n, max(1, round(mean)))
        sigma2 = np.log1p(cv * cv)
        x = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)
        return np.maximum(1, np.rint(x)).astype(int)

    prompts, outputs = draw(prompt_mean), draw(output_mean)
    outputs = np.minimum(outputs, MAX_LEN - prompts)
    return list(zip(prompts.tolist(), outputs.tolist(), strict=True))


def means(pairs: list[tuple[int, int]]) -> tuple[float, float]:
    return float(np.mean([a for a, _ in pairs])), float(np.mean([b for _, b in pairs]))
