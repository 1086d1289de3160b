"""Replay of a production trace: recorded arrival gaps and token counts, with stand-in prompts.

The schema is that of the Azure LLM inference traces (see shared/data/traces/README.md):
`TIMESTAMP` (e.g. `2023-11-16 18:15:46.6805900`), `ContextTokens`, `GeneratedTokens`. The
real prompts are not public, so each request gets a prompt of exactly ContextTokens tokens
of corpus prose and must generate exactly GeneratedTokens tokens (EOS ignored).

A CSV of lengths alone works too: the arXiv summarization lengths of the Sarathi-Serve and
Vidur papers (`num_prefill_tokens`, `num_decode_tokens`) are recognised by their header, and
any other pair of columns can be named (`prompt_column`, `output_column`). Such a file has no
arrival times, so it is served under a generated arrival process (`arrival=poisson`, `gamma`
or `burst` at `rate` requests/s), drawn by the synthetic workload's own `sample_arrivals`; an
Azure file can be served so too, its timestamps then unread. Studies that need a load of
their choosing with realistic lengths (goodput against the request rate) build on this.

Choices (also on `TraceWorkloadConfig`): recorded arrivals are measured from the earliest
timestamp in the slice (the first row, in a time-ordered trace) and multiplied by
`time_scale`, so 0.5 replays twice as fast. Generated arrivals start at t=0 and draw from a
stream of their own (seeded by `seed`), so the prompts are the same whatever the arrival
process or rate, and a probe at another rate sees the same requests with every gap scaled.
Counts are clamped to the caps and to at least 1 token, since an engine can neither run an
empty prompt nor generate nothing.
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

from framework.core.request import RequestSpec
from framework.workloads.common import (
    request_id,
    require_at_least,
    require_choice,
    require_positive,
    sampling_for,
)
from framework.workloads.config import MooncakeWorkloadConfig, TraceWorkloadConfig
from framework.workloads.synthetic import ARRIVALS, sample_arrivals
from framework.workloads.text import exact_length_prompts

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TIME_COLUMN = COLUMNS[0]
# (prompt, output) length columns recognised from a header, in this order of preference:
# the Azure traces', then the arXiv summarization lengths' (Vidur's processed traces).
LENGTH_LAYOUTS = (("ContextTokens", "GeneratedTokens"), ("num_prefill_tokens", "num_decode_tokens"))
TRACE_ARRIVALS = ("recorded", *ARRIVALS)
_ARRIVAL_STREAM = 1  # generated arrivals draw from (seed, this): apart from the prompts' seed


@dataclass(frozen=True)
class TraceRow:
    """One parsed row, before caps and time scaling (`time` is None when the row's
    timestamp was not read: a file of lengths alone, or generated arrivals)."""

    time: datetime | None
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class Layout:
    """Which columns a file's rows are read from (`time` None: timestamps unread)."""

    time: str | None
    prompt: str
    output: str


def _parse_row(
    row: dict[str | None, str | None], where: str, layout: Layout, fields: list[str]
) -> TraceRow:
    """Parse one CSV record; `where` ("file:line") leads every message."""
    needed = [c for c in (layout.time, layout.prompt, layout.output) if c is not None]
    if None in row or any(row[c] is None for c in needed):
        raise ValueError(f"{where}: expected {len(fields)} fields ({', '.join(fields)})")
    time = None
    if layout.time is not None:
        stamp = str(row[layout.time]).strip()
        try:
            time = datetime.fromisoformat(stamp)
        except ValueError:
            raise ValueError(
                f"{where}: {layout.time} {stamp!r} is not a date-time like "
                "'2023-11-16 18:15:46.6805900'"
            ) from None
    counts: list[int] = []
    for name in (layout.prompt, layout.output):
        value = str(row[name]).strip()
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"{where}: {name} {value!r} is not an integer") from None
        if count < 0:
            raise ValueError(f"{where}: {name} must be >= 0, got {count}")
        counts.append(count)
    return TraceRow(time, counts[0], counts[1])


def find_layout(
    path: Path,
    found: list[str],
    *,
    timed: bool,
    prompt_column: str | None = None,
    output_column: str | None = None,
) -> Layout:
    """The columns to read from a header `found`: the named ones, else the first layout of
    `LENGTH_LAYOUTS` present, plus TIMESTAMP when arrivals are recorded (`timed`)."""
    if (prompt_column is None) != (output_column is None):
        given, other = (
            ("prompt_column", "output_column")
            if prompt_column is not None
            else ("output_column", "prompt_column")
        )
        raise ValueError(
            f"workload.{given} is set but workload.{other} is not: name both length columns, "
            "or neither to recognise them from the header"
        )
    listed = ", ".join(found) if found else "none (empty file)"
    if prompt_column is not None and output_column is not None:
        for field, name in (("prompt_column", prompt_column), ("output_column", output_column)):
            if name not in found:
                raise ValueError(
                    f"workload.{field}={name!r}: {path} has no such column; found {listed}"
                )
        lengths: tuple[str, str] | None = (prompt_column, output_column)
    else:
        lengths = next((p for p in LENGTH_LAYOUTS if set(p) <= set(found)), None)
    if timed and lengths is None:
        hint = (
            "; a file of lengths alone (num_prefill_tokens, num_decode_tokens, or the columns "
            "named by workload.prompt_column and workload.output_column) needs "
            "workload.arrival=poisson, gamma or burst"
        )
        raise ValueError(
            f"{path}: a trace needs the columns {', '.join(COLUMNS)}; found {listed}"
            f"{hint if found else ''}"
        )
    if timed and TIME_COLUMN not in found:
        raise ValueError(
            f"{path}: no {TIME_COLUMN} column, so no recorded arrivals (found {listed}); "
            "serve its lengths with workload.arrival=poisson (or gamma, burst) and "
            "workload.rate=REQUESTS_PER_S"
        )
    if lengths is None:
        layouts = " or ".join(", ".join(p) for p in LENGTH_LAYOUTS)
        raise ValueError(
            f"{path}: a trace needs the length columns {layouts} (or name them: "
            f"workload.prompt_column, workload.output_column); found {listed}"
        )
    return Layout(TIME_COLUMN if timed else None, *lengths)


def read_trace(
    path: Path,
    start: int,
    limit: int | None,
    *,
    timed: bool = True,
    prompt_column: str | None = None,
    output_column: str | None = None,
) -> list[TraceRow]:
    """Rows `start` .. `start + limit` (0-based, header excluded) of a trace CSV; with
    `timed` False their timestamps are neither needed nor read (see `find_layout`).

    Only the slice is parsed, so replaying the first hundred rows of a large trace is cheap.
    """
    if not path.is_file():
        raise FileNotFoundError(f"workload.path: trace file not found: {path}")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        found = list(reader.fieldnames or [])
        layout = find_layout(
            path, found, timed=timed, prompt_column=prompt_column, output_column=output_column
        )
        stop = None if limit is None else start + limit
        rows = [
            _parse_row(row, f"{path}:{reader.line_num}", layout, found)
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


def check_arrival(cfg: TraceWorkloadConfig) -> None:
    """The arrival options: a process, and a rate exactly where one is used. A rate beside
    recorded arrivals, or a time scale beside generated ones, would be silently ignored,
    so either is refused rather than leave the load other than the user meant."""
    require_choice("arrival", cfg.arrival, TRACE_ARRIVALS)
    if cfg.arrival == "recorded":
        if cfg.rate is not None:
            raise ValueError(
                f"workload.rate={cfg.rate} applies to workload.arrival=poisson or gamma; "
                "arrival=recorded replays the trace's timestamps (scale them with "
                "workload.time_scale), so set workload.arrival=poisson or drop the rate"
            )
        return
    if cfg.time_scale != 1.0:
        raise ValueError(
            f"workload.time_scale={cfg.time_scale} scales recorded arrivals only; with "
            f"workload.arrival={cfg.arrival} the load is workload.rate (requests per second)"
        )
    if cfg.arrival in ("poisson", "gamma"):
        if cfg.rate is None:
            raise ValueError(
                f"workload.rate is required for workload.arrival={cfg.arrival}: requests per "
                "second, e.g. workload.rate=2.0"
            )
        require_positive("rate", cfg.rate)
    if cfg.arrival == "gamma":
        require_positive("cv", cfg.cv)


def trace_rows(cfg: TraceWorkloadConfig) -> list[TraceRow]:
    """The slice's rows, every option checked (no tokenizer needed, so a missing file or a
    malformed row is reported before any model loads)."""
    check_replay(cfg)
    check_arrival(cfg)
    # Relative to where the user launched the run, even if Hydra changed the working directory.
    return read_trace(
        Path(to_absolute_path(cfg.path)),
        cfg.start,
        cfg.limit,
        timed=cfg.arrival == "recorded",
        prompt_column=cfg.prompt_column,
        output_column=cfg.output_column,
    )


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


def trace_arrivals(cfg: TraceWorkloadConfig, rows: list[TraceRow]) -> np.ndarray:
    """Each row's arrival in seconds: recorded (from the slice's earliest timestamp, times
    `time_scale`) or drawn by the synthetic workload's arrival process."""
    if cfg.arrival == "recorded":
        times = [row.time for row in rows if row.time is not None]
        assert len(times) == len(rows)  # read_trace read every timestamp (timed)
        t0 = min(times)
        return np.array([(t - t0).total_seconds() * cfg.time_scale for t in times])
    rng = np.random.default_rng((cfg.seed, _ARRIVAL_STREAM))
    # burst uses no rate; sample_arrivals checks one all the same, so it gets a stand-in
    rate = 1.0 if cfg.rate is None else cfg.rate
    return sample_arrivals(rng, len(rows), process=cfg.arrival, rate=rate, cv=cfg.cv)


def build_trace(cfg: TraceWorkloadConfig, tokenizer: PreTrainedTokenizerBase) -> list[RequestSpec]:
    """One request per row of the slice, ids in row order."""
    rows = trace_rows(cfg)
    arrivals = trace_arrivals(cfg, rows)
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
            arrival=float(arrival),
            prompt=text,
        )
        for i, (row, (ids, text), arrival) in enumerate(zip(rows, prompts, arrivals, strict=True))
    ]
