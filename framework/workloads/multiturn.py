"""Multi-turn conversations: each turn's prompt is the whole previous turn's prompt and more.

Turn 1 of a conversation is its system opening + question 1; turn k is turn k-1's prompt +
answer k-1 + question k, concatenated as token ids, so a prefix cache can serve all but the
new tail of every later turn. A workload is built before the run, so answer k-1 is not what
the model said at turn k-1 but a seeded corpus window of `answer_tokens` tokens standing in
for it: the lengths and the sharing are those of a real chat, the words are not.

Arrivals are open loop: a conversation starts at a Poisson time (or t=0) and its turn k
arrives `(k-1) * think_time_s` later, whether or not turn k-1 has finished by then.

Requests are numbered conversation by conversation (r0 .. r{T-1} are conversation 0's turns),
which is the order seeds `seed + i` follow; `build_workload` then sorts them by arrival.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.workloads.common import (
    request_id,
    require_at_least,
    require_positive,
    sampling_for,
)
from framework.workloads.config import MultiturnWorkloadConfig
from framework.workloads.shared_prefix import distinct_windows
from framework.workloads.synthetic import sample_arrivals
from framework.workloads.text import exact_length_prompts


def multiturn_prompt_lens(cfg: MultiturnWorkloadConfig) -> list[int]:
    """Every option checked (no tokenizer needed, so a bad value is reported before any model
    loads); returns each request's prompt length, in request order."""
    require_at_least("conversations", cfg.conversations, 1)
    require_at_least("turns", cfg.turns, 1)
    require_at_least("system_tokens", cfg.system_tokens, 1)
    require_at_least("question_tokens", cfg.question_tokens, 1)
    require_at_least("answer_tokens", cfg.answer_tokens, 0)
    require_at_least("max_tokens", cfg.max_tokens, 1)
    require_at_least("think_time_s", cfg.think_time_s, 0)
    if cfg.rate is not None:
        require_positive("rate", cfg.rate)
    one = [
        cfg.system_tokens + k * cfg.question_tokens + (k - 1) * cfg.answer_tokens
        for k in range(1, cfg.turns + 1)
    ]
    return one * cfg.conversations


def multiturn_sizes(cfg: MultiturnWorkloadConfig) -> list[int]:
    """Each request's prompt + max_tokens: what the KV pool must hold, for the fit check."""
    return [length + cfg.max_tokens for length in multiturn_prompt_lens(cfg)]


def _streams(cfg: MultiturnWorkloadConfig) -> list[np.random.Generator]:
    """Independent generators for system text, questions, answers and conversation starts."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4)]


def build_multiturn(
    cfg: MultiturnWorkloadConfig, tokenizer: PreTrainedTokenizerBase
) -> list[RequestSpec]:
    """`conversations * turns` requests, conversation by conversation."""
    multiturn_prompt_lens(cfg)
    c, t = cfg.conversations, cfg.turns
    system_rng, question_rng, answer_rng, start_rng = _streams(cfg)
    # Distinct openings, so that two conversations never share a prefix by accident.
    systems = distinct_windows(
        tokenizer, c, cfg.system_tokens, system_rng, what="workload.system_tokens"
    )
    questions = exact_length_prompts(tokenizer, [cfg.question_tokens] * (c * t), question_rng)
    # The last turn's answer is never sent; drawing it anyway keeps the streams simple.
    answers = exact_length_prompts(tokenizer, [cfg.answer_tokens] * (c * t), answer_rng)
    if cfg.rate is None:
        starts = np.zeros(c)
    else:
        starts = sample_arrivals(start_rng, c, process="poisson", rate=cfg.rate, cv=1.0)
    specs: list[RequestSpec] = []
    for conv in range(c):
        ids, text = systems[conv]
        for turn in range(t):
            i = conv * t + turn
            if turn > 0:
                answer_ids, answer_text = answers[i - 1]
                ids, text = ids + answer_ids, text + answer_text
            question_ids, question_text = questions[i]
            ids, text = ids + question_ids, text + question_text
            specs.append(
                RequestSpec(
                    id=request_id(i),
                    prompt_token_ids=ids,
                    sampling=sampling_for(
                        cfg, i, max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos
                    ),
                    arrival=float(starts[conv] + turn * cfg.think_time_s),
                    prompt=text,  # for reports only; the ids are the prompt
                )
            )
    return specs
