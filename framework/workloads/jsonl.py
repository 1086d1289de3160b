"""Requests read from a JSON Lines file: the way to bring your own prompts.

One JSON object per line (blank lines are skipped):

    {"prompt": "Why is the sea salty?", "max_tokens": 64}
    {"prompt": "Once upon a time", "max_tokens": 32, "chat": false, "arrival": 1.5,
     "temperature": 0.8, "top_p": 0.95, "top_k": 50, "seed": 7, "ignore_eos": true,
     "priority": -1, "n": 4}

`prompt` and `max_tokens` are required. The rest default to the workload's values; `seed`
defaults to `workload.seed + i` for the i-th request, `arrival` to 0, `ignore_eos` to false,
`priority` to 0 (lower is more urgent; only priority-aware policies read it), `n` (samples
of the prompt, parallel sampling) to the workload's, and `chat`
(apply the chat template) to `workload.chat`. Unknown keys are errors, so a typo
such as `max_token` is caught instead of silently falling back to a default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path
from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec, SamplingParams
from framework.workloads.chat import encode_prompt
from framework.workloads.common import request_id, sampling_for
from framework.workloads.config import JsonlWorkloadConfig

# key -> (accepted JSON types, description for messages). bool is a subclass of int in
# Python, so it is rejected explicitly for the numeric keys below.
_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "prompt": ((str,), "a string"),
    "max_tokens": ((int,), "an integer"),
    "temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "top_k": ((int,), "an integer"),
    "seed": ((int,), "an integer"),
    "n": ((int,), "an integer"),
    "arrival": ((int, float), "a number"),
    "ignore_eos": ((bool,), "true or false"),
    "chat": ((bool,), "true or false"),
    "priority": ((int,), "an integer"),
}
_REQUIRED = ("prompt", "max_tokens")


def _check_record(record: Any, where: str) -> dict[str, Any]:
    """Validate one parsed line, with `where` ("file:line") leading every message."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: each line must be a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed keys: {', '.join(_KEYS)}")
    for key in _REQUIRED:
        if key not in record:
            raise ValueError(f"{where}: missing required key {key!r}")
    for key, value in record.items():
        types, description = _KEYS[key]
        is_bool = isinstance(value, bool)
        if not isinstance(value, types) or (is_bool and bool not in types):
            raise ValueError(f"{where}: {key!r} must be {description}, got {value!r}")
    if not record["prompt"]:
        raise ValueError(f"{where}: 'prompt' must not be empty")
    if record.get("arrival", 0) < 0:
        raise ValueError(f"{where}: 'arrival' must be >= 0, got {record['arrival']}")
    return record


def read_jsonl(cfg: JsonlWorkloadConfig) -> list[tuple[dict[str, Any], SamplingParams]]:
    """Every non-blank line, checked, with its sampling parameters (no tokenizer needed, so
    a missing file or a bad line is reported, with file and line, before any model loads)."""
    # Relative to where the user launched the run, even if Hydra changed the working directory.
    path = Path(to_absolute_path(cfg.path))
    if not path.is_file():
        raise FileNotFoundError(f"workload.path: JSONL file not found: {path}")
    records: list[tuple[dict[str, Any], SamplingParams]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = _check_record(json.loads(line), where)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from e
            overrides = {
                k: record[k] for k in ("temperature", "top_p", "top_k", "seed", "n") if k in record
            }
            try:
                sampling = sampling_for(
                    cfg,
                    len(records),
                    max_tokens=record["max_tokens"],
                    ignore_eos=record.get("ignore_eos", False),
                    **overrides,
                )
            except ValueError as e:  # SamplingParams' own range checks
                raise ValueError(f"{where}: {e}") from e
            records.append((record, sampling))
    if not records:
        raise ValueError(f"workload.path: {path} holds no requests (every line is blank)")
    return records


def build_jsonl(cfg: JsonlWorkloadConfig, tokenizer: PreTrainedTokenizerBase) -> list[RequestSpec]:
    """One request per non-blank line, ids in file order."""
    return [
        RequestSpec(
            id=request_id(i),
            prompt_token_ids=encode_prompt(
                tokenizer, record["prompt"], chat=record.get("chat", cfg.chat)
            ),
            sampling=sampling,
            arrival=float(record.get("arrival", 0.0)),
            prompt=record["prompt"],
            priority=record.get("priority", 0),
        )
        for i, (record, sampling) in enumerate(read_jsonl(cfg))
    ]
