"""The default job: a handful of short, varied chat prompts shipped with the package.

It exists so that `make run` shows a model answering real questions with no data to fetch;
arrivals are all 0 and EOS is honoured, so it is a smoke test, not a load test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.workloads.common import request_id, require_at_least, sampling_for
from framework.workloads.config import ChatWorkloadConfig

_PROMPTS_FILE = "chat_prompts.jsonl"


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, *, chat: bool) -> list[int]:
    """Token ids of a user prompt, through the chat template when asked and available.

    A tokenizer without a template (a base model) gets the plain text, with the special tokens
    (BOS) the model expects at the start of a sequence.
    """
    if not chat or getattr(tokenizer, "chat_template", None) is None:
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=True)]
    out: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    # transformers 5 returns a BatchEncoding by default, 4.x a plain list.
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):  # a batch of one
        out = out[0]
    return [int(t) for t in out]


def load_chat_prompts() -> list[str]:
    """The shipped prompts, in file order."""
    text = (resources.files(__package__) / "data" / _PROMPTS_FILE).read_text(encoding="utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def check_chat(cfg: ChatWorkloadConfig) -> None:
    """The options, checked without a tokenizer."""
    require_at_least("max_tokens", cfg.max_tokens, 1)
    if cfg.limit is not None:
        require_at_least("limit", cfg.limit, 1)


def build_chat(cfg: ChatWorkloadConfig, tokenizer: PreTrainedTokenizerBase) -> list[RequestSpec]:
    """Every shipped prompt (or the first `limit`), all arriving at t=0."""
    check_chat(cfg)
    prompts = load_chat_prompts()
    if cfg.limit is not None:
        prompts = prompts[: cfg.limit]
    return [
        RequestSpec(
            id=request_id(i),
            prompt_token_ids=encode_prompt(tokenizer, prompt, chat=True),
            sampling=sampling_for(cfg, i, max_tokens=cfg.max_tokens, ignore_eos=False),
            prompt=prompt,
        )
        for i, prompt in enumerate(prompts)
    ]
