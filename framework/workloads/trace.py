"""Replay of a production trace: recorded arrival gaps and token counts, with stand-in prompts.

The schema is that of the Azure LLM inference traces (see shared/data/traces/README.md):
`TIMESTAMP` (e.g. `2023-11-16 18:15:46.6805900`), `ContextTokens`, `GeneratedTokens`. The
real prompts are not public, so each request gets a prompt of exactly ContextTokens tokens
of corpus prose and must generate exactly GeneratedTokens tokens (EOS ignored).

Choices (also on `TraceWorkloadConfig`): arrivals are measured from the earliest timestamp
in the slice (the first row, in a time-ordered trace) and multiplied by `time_scale`, so 0.5
replays twice as fast. Counts are clamped to the caps and to at least 1 token, since an
engine can neither run an empty prompt nor generate nothing.
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import to_absolute_path
from transformers import PreTrainedTokenizerBase

from framework.engine.request import RequestSpec
from framework.workloads.common import request_id, require_at_least, sampling_for
from framework.workloads.config import MooncakeWorkloadConfig, TraceWorkloadConfig
from framework.workloads.text import exact_length_prompts

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class TraceRow:
    """One parsed row, before caps and time scaling."""

    time: datetime
    context_tokens: int
    generated_tokens: int


def _parse_row(row: dict[str | None, str | None], where: str) -> TraceRow:
    """Parse one CSV record; `where` ("file:line") leads every message."""
    if None in row or any(row[c] is None for c in COLUMNS):
        raise ValueError(f"{where}: expected {len(COLUMNS)} fields ({', '.join(COLUMNS)})")
    stamp, context, generated = (str(row[c]).strip() for c in COLUMNS)
    try:
        time = datetime.fromisoformat(stamp)
    except ValueError:
        raise ValueError(
            f"{where}: TIMESTAMP {stamp!r} is not a date-time like '2023-11-16 18:15:46.6805900'"
        ) from None
    counts: list[int] = []
    for name, value in (("ContextTokens", context), ("GeneratedTokens", generated)):
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"{where}: {name} {value!r} is not an integer") from None
        if count < 0:
            raise ValueError(f"{where}: {name} must be >= 0, got {count}")
        counts.append(count)
    return TraceRow(time, counts[0], counts[1])


def read_trace(path: Path, start: int, limit: int | None) -> list[TraceRow]:
    """Rows `start` .. `start + limit` (0-based, header excluded) of a trace CSV.

    Only the slice is parsed, so replaying the first hundred rows of a large trace is cheap.
    """
    if not path.is_file():
        raise FileNotFoundError(f"workload.path: trace file not found: {path}")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        found = reader.fieldnames or []
        if not set(COLUMNS) <= set(found):
            raise ValueError(
                f"{path}: a trace needs the columns {', '.join(COLUMNS)}; "
                f"found {', '.join(found) if found else 'none (empty file)'}"
            )
        stop = None if limit is None else start + limit
        rows = [
            _parse_row(row, f"{path}:{reader.line_num}")
            for row in itertools.islice(reader, start, stop)
        ]
    if not rows:
        raise ValueError(f"workload.start={start}: {path} has no data rows from there on")
    return rows


def clamp_count(count: int, cap: int | None) -> int:
    """A recorded token count under its cap (None: no cap), and at least 1."""
    return max(1, count if cap is None else min(count, cap))


def check_replay(cfg: TraceWorkloadConfig | MooncakeWorkloadConfig) -> None:
    """The options every trace replay shares: the row slice, `time_scale` and the caps."""
    require_at_least("start", cfg.start, 0)
    if cfg.limit is not None:
        require_at_least("limit", cfg.limit, 1)
    require_at_least("time_scale", cfg.time_scale, 0)
    for name in ("max_prompt_tokens", "max_output_tokens"):
        cap = getattr(cfg, name)
        if cap is not None:
            require_at_least(name, cap, 1)


def trace_rows(cfg: TraceWorkloadConfig) -> list[TraceRow]:
    """The slice's rows, every option checked (no tokenizer needed, so a missing file or a
    malformed row is reported before any model loads)."""
    check_replay(cfg)
    # Relative to where the user launched the run, even if Hydra changed the working directory.
    return read_trace(Path(to_absolute_path(cfg.path)), cfg.start, cfg.limit)


def trace_sizes(cfg: TraceWorkloadConfig, rows: list[TraceRow]) -> list[int]:
    """Each request's prompt + max_tokens after the caps: what the KV pool must hold."""
    return replay_sizes(cfg, [(r.context_tokens, r.generated_tokens) for r in rows])


def replay_sizes(cfg: Any, lengths: list[tuple[int, int]]) -> list[int]:
    """(prompt, output) lengths of a replayed trace, each clamped by the workload's
    `max_prompt_tokens` / `max_output_tokens`, summed: what the KV pool must hold."""
    return [
        clamp_count(prompt, cfg.max_prompt_tokens) + clamp_count(output, cfg.max_output_tokens)
        for prompt, output in lengths
    ]


def build_trace(cfg: TraceWorkloadConfig, tokenizer: PreTrainedTokenizerBase) -> list[RequestSpec]:
    """One request per row of the slice, ids in row order."""
    rows = trace_rows(cfg)
    t0 = min(row.time for row in rows)
    prompt_lens = [clamp_count(row.context_tokens, cfg.max_prompt_tokens) for row in rows]
    prompts = exact_length_prompts(tokenizer, prompt_lens, np.random.default_rng(cfg.seed))
    return [
        RequestSpec(
            id=request_id(i),
            prompt_token_ids=ids,
            sampling=sampling_for(
                cfg,
                i,
                max_tokens=clamp_count(row.generated_tokens, cfg.max_output_tokens),
                ignore_eos=True,
            ),
            arrival=(row.time - t0).total_seconds() * cfg.time_scale,
            prompt=text,
        )
        for i, (row, (ids, text)) in enumerate(zip(rows, prompts, strict=True))
    ]
