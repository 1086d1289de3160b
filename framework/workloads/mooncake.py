"""Replay of a Mooncake trace: recorded arrivals and lengths, and the prefix sharing they had.

The format is that of the Mooncake FAST'25 traces (see shared/data/traces/README.md), one JSON
object per line:

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ...]}

`timestamp` is the arrival in milliseconds, and hash id k names the k-th `block_tokens`-token
block of the prompt: two requests whose lists start with the same k ids share their first k
blocks. The text is not public, so each hash id stands for a fixed block of token ids drawn
from a generator seeded by (workload seed, hash id) alone; equal ids give equal blocks, and a
prefix cache sees exactly the reuse the trace recorded. The ids are uniform over the
tokenizer's ordinary vocabulary, not corpus windows as in `trace.py`: the ~7k-token corpus
has too few distinct windows for the conversation trace's ~180k hash ids, and two ids that
drew the same window would fake a prefix hit.

The prompt is exactly `input_length` tokens: the last named block is cut short, ids past the
length are unused, and tokens past the last named block (the published traces have none) are
drawn from a stream of the request's own line, so they are shared with no other request.
Outputs are forced to `output_length` tokens (EOS ignored). The slice, `time_scale` and the
caps behave as for `trace`, with which this module shares its checks and its clamp.
"""

from __future__ import annotations

import itertools
import json
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import to_absolute_path
from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.workloads.common import request_id, require_at_least, sampling_for
from framework.workloads.config import MooncakeWorkloadConfig
from framework.workloads.trace import check_replay, clamp_count, replay_sizes

KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
_BLOCK, _TAIL = 0, 1  # seed domains: a hash id's block, a line's own tail


@dataclass(frozen=True)
class MooncakeRow:
    """One parsed line, before caps and time scaling; `line` is its 0-based row index."""

    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _is_count(value: Any) -> bool:
    """A JSON integer >= 0 (JSON true and false parse to bool, a subclass of int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_line(text: str, row: int, where: str) -> MooncakeRow:
    """Parse one line; `where` ("file:line") leads every message. Extra keys are ignored."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: each line must be a JSON object, got {type(record).__name__}")
    missing = [k for k in KEYS if k not in record]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}; a line needs {', '.join(KEYS)}")
    for key in KEYS[:3]:
        if not _is_count(record[key]):
            raise ValueError(f"{where}: {key} must be an integer >= 0, got {record[key]!r}")
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list):
        raise ValueError(f"{where}: hash_ids must be a list of integers, got {hash_ids!r}")
    for k, h in enumerate(hash_ids):
        if not _is_count(h):
            raise ValueError(f"{where}: hash_ids[{k}] must be an integer >= 0, got {h!r}")
    return MooncakeRow(
        row, record["timestamp"], record["input_length"], record["output_length"], tuple(hash_ids)
    )


def read_mooncake(path: Path, start: int, limit: int | None) -> list[MooncakeRow]:
    """Lines `start` .. `start + limit` (0-based, blank lines skipped) of a Mooncake trace.

    Only the slice is parsed, so replaying the first hundred lines of a large trace is cheap.
    """
    if not path.is_file():
        raise FileNotFoundError(f"workload.path: Mooncake trace file not found: {path}")
    with path.open(encoding="utf-8") as f:
        lines = ((n, text) for n, text in enumerate(f, start=1) if text.strip())
        stop = None if limit is None else start + limit
        rows = [
            _parse_line(text, row, f"{path}:{n}")
            for row, (n, text) in enumerate(itertools.islice(lines, start, stop), start=start)
        ]
    if not rows:
        raise ValueError(f"workload.start={start}: {path} has no lines from there on")
    return rows


def mooncake_rows(cfg: MooncakeWorkloadConfig) -> list[MooncakeRow]:
    """The slice's rows, every option checked (no tokenizer needed, so a missing file or a
    malformed line is reported before any model loads)."""
    check_replay(cfg)
    require_at_least("block_tokens", cfg.block_tokens, 1)
    # Relative to where the user launched the run, even if Hydra changed the working directory.
    return read_mooncake(Path(to_absolute_path(cfg.path)), cfg.start, cfg.limit)


def mooncake_sizes(cfg: MooncakeWorkloadConfig, rows: list[MooncakeRow]) -> list[int]:
    """Each request's prompt + max_tokens after the caps: what the KV pool must hold."""
    return replay_sizes(cfg, [(r.input_length, r.output_length) for r in rows])


def stand_in_vocabulary(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """The ids a stand-in prompt draws from: [0, len(tokenizer)) less the special and added
    tokens, since EOS, BOS, padding or chat markers inside a prompt change how it is read."""
    excluded = {*tokenizer.all_special_ids, *tokenizer.added_tokens_decoder}
    vocab = np.setdiff1d(np.arange(len(tokenizer)), np.fromiter(excluded, dtype=np.int64))
    if vocab.size == 0:
        raise ValueError("the tokenizer has no ordinary tokens to build Mooncake prompts from")
    return vocab


class _Prompts:
    """Prompt ids from hash ids: one seeded block per hash id (cached, since the ids recur)."""

    def __init__(self, cfg: MooncakeWorkloadConfig, vocab: np.ndarray) -> None:
        self.seed, self.block_tokens, self.vocab = cfg.seed, cfg.block_tokens, vocab
        self.blocks: dict[int, np.ndarray] = {}

    def _draw(self, domain: int, key: int, size: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, domain, key))
        return self.vocab[rng.integers(0, self.vocab.size, size=size)].astype(np.int32)

    def _block(self, hash_id: int) -> np.ndarray:
        block = self.blocks.get(hash_id)
        if block is None:
            block = self.blocks[hash_id] = self._draw(_BLOCK, hash_id, self.block_tokens)
        return block

    def ids(self, row: MooncakeRow, length: int) -> array[int]:
        """`length` ids: the row's hash-id blocks, then its own tail if they run out. As an
        `array('i')`, 4 bytes a token: the whole trace is 145 million prompt tokens, which
        as a list of Python ints held 5 GB."""
        named = min(len(row.hash_ids), -(-length // self.block_tokens))
        parts = [self._block(h) for h in row.hash_ids[:named]]
        tail = length - named * self.block_tokens
        if tail > 0:
            parts.append(self._draw(_TAIL, row.line, tail))
        return array("i", np.concatenate(parts)[:length].astype(np.int32).tobytes())


def build_mooncake(
    cfg: MooncakeWorkloadConfig, tokenizer: PreTrainedTokenizerBase
) -> list[RequestSpec]:
    """One request per line of the slice, ids in line order."""
    rows = mooncake_rows(cfg)
    t0 = min(row.timestamp_ms for row in rows)
    prompts = _Prompts(cfg, stand_in_vocabulary(tokenizer))
    return [
        RequestSpec(
            id=request_id(i),
            # An `array('i')` (`_Prompts.ids`): the engine reads a prompt as any sequence of
            # ints, though `RequestSpec` still says list[int] (framework/core/request.py).
            prompt_token_ids=prompts.ids(  # type: ignore[arg-type]
                row, clamp_count(row.input_length, cfg.max_prompt_tokens)
            ),
            sampling=sampling_for(
                cfg,
                i,
                max_tokens=clamp_count(row.output_length, cfg.max_output_tokens),
                ignore_eos=True,
            ),
            arrival=(row.timestamp_ms - t0) / 1000 * cfg.time_scale,
        )
        for i, row in enumerate(rows)
    ]
