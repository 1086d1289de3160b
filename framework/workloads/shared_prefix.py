"""N system prompts x M questions each: the workload prefix caching is measured on.

Every prompt is a prefix's token ids followed by a question's, concatenated as ids (not as
text, which could re-tokenize differently at the seam), so the requests of one prefix share
exactly their first `prefix_tokens` ids and a block-hashing KV cache can reuse those blocks.
Prefixes and questions are corpus windows (`text.py`) at seeded offsets, redrawn until no two
are equal: two prefixes that happened to coincide would turn N prefixes into N - 1 and make
the hit rate look better than the configuration says.

The parameterisation is documented on `SharedPrefixWorkloadConfig`. One seed drives
everything, split with `SeedSequence.spawn` into independent streams for prefix text,
question text, order and arrivals, so that switching `order` or `rate` keeps the same text.
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
from framework.workloads.config import SharedPrefixWorkloadConfig
from framework.workloads.synthetic import sample_arrivals
from framework.workloads.text import exact_length_prompts, tokenized_corpus

ORDERS = ("interleaved", "grouped")
_MAX_ROUNDS = 100  # redraw rounds before giving up on finding enough distinct windows


def distinct_windows(
    tokenizer: PreTrainedTokenizerBase,
    count: int,
    length: int,
    rng: np.random.Generator,
    *,
    what: str,
) -> list[tuple[list[int], str]]:
    """`count` (ids, text) corpus windows of `length` tokens, no two with the same ids.

    Windows equal to an earlier one are drawn again from `rng`, so the result is still a
    function of the seed (and, when nothing collides, the same as one `exact_length_prompts`
    call). `what` ("workload.prefix_tokens", say) names the setting to change when the corpus
    cannot supply that many distinct windows.
    """
    corpus_size = int(tokenized_corpus(tokenizer).ids.size)
    windows: list[tuple[list[int], str]] = []
    seen: set[tuple[int, ...]] = set()
    for _ in range(_MAX_ROUNDS):
        for ids, text in exact_length_prompts(tokenizer, [length] * (count - len(windows)), rng):
            if tuple(ids) not in seen:
                seen.add(tuple(ids))
                windows.append((ids, text))
        if len(windows) == count:
            return windows
    raise ValueError(
        f"{what}: found only {len(windows)} distinct windows of {length} tokens in the "
        f"corpus ({corpus_size} tokens under this tokenizer), {count} are needed; ask for "
        "fewer or longer ones"
    )


def _streams(cfg: SharedPrefixWorkloadConfig) -> list[np.random.Generator]:
    """Independent generators for prefix text, question text, order and arrivals."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4)]


def shared_prefix_sizes(cfg: SharedPrefixWorkloadConfig) -> list[int]:
    """Every option checked (no tokenizer needed, so a bad value is reported before any model
    loads); returns each request's prompt + max_tokens, for the up-front fit check."""
    require_at_least("num_prefixes", cfg.num_prefixes, 1)
    require_at_least("questions_per_prefix", cfg.questions_per_prefix, 1)
    require_at_least("prefix_tokens", cfg.prefix_tokens, 1)
    require_at_least("question_tokens", cfg.question_tokens, 1)
    require_at_least("max_tokens", cfg.max_tokens, 1)
    require_choice("order", cfg.order, ORDERS)
    if cfg.rate is not None:
        require_positive("rate", cfg.rate)
    n = cfg.num_prefixes * cfg.questions_per_prefix
    return [cfg.prefix_tokens + cfg.question_tokens + cfg.max_tokens] * n


def _arrivals(cfg: SharedPrefixWorkloadConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """All at t=0, or Poisson at `rate` with the first at t=0 (as the synthetic workload)."""
    if cfg.rate is None:
        return np.zeros(n)
    return sample_arrivals(rng, n, process="poisson", rate=cfg.rate, cv=1.0)


def build_shared_prefix(
    cfg: SharedPrefixWorkloadConfig, tokenizer: PreTrainedTokenizerBase
) -> list[RequestSpec]:
    """`num_prefixes * questions_per_prefix` requests, ids in `order`."""
    n = len(shared_prefix_sizes(cfg))
    prefix_rng, question_rng, order_rng, arrival_rng = _streams(cfg)
    prefixes = distinct_windows(
        tokenizer, cfg.num_prefixes, cfg.prefix_tokens, prefix_rng, what="workload.prefix_tokens"
    )
    questions = distinct_windows(
        tokenizer, n, cfg.question_tokens, question_rng, what="workload.question_tokens"
    )
    # (prefix, question) pairs; question p * M + q is the q-th question of prefix p.
    pairs = [
        (p, p * cfg.questions_per_prefix + q)
        for p in range(cfg.num_prefixes)
        for q in range(cfg.questions_per_prefix)
    ]
    if cfg.order == "interleaved":
        pairs = [pairs[j] for j in order_rng.permutation(n)]
    arrivals = _arrivals(cfg, n, arrival_rng)
    specs: list[RequestSpec] = []
    for i, ((p, q), arrival) in enumerate(zip(pairs, arrivals, strict=True)):
        (prefix_ids, prefix_text), (question_ids, question_text) = prefixes[p], questions[q]
        specs.append(
            RequestSpec(
                id=request_id(i),
                prompt_token_ids=prefix_ids + question_ids,
                sampling=sampling_for(cfg, i, max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos),
                arrival=float(arrival),
                prompt=prefix_text + question_text,  # for reports only; the ids are the prompt
            )
        )
    return specs
