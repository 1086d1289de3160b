"""Token streams for the simulated executor: deterministic, seeded, and honouring each
request's stop and length rules, so that every count (steps, preemptions, overshoot under
deferred output, a static batch's waste) behaves as in a real run.

Where a request stops, in order:
- a replayed run (`executor.replay=outputs.jsonl` of a real run, by request id): its very
  tokens, so the stop lands where the model put it and the counts match that run;
- `ignore_eos` with no stop tokens: at `max_tokens`, as traces ask;
- otherwise a seeded draw of the output length (geometric, mean `mean_output_tokens`,
  capped at `max_tokens`), ending on the request's stop token.

A token is a function of (request, token index) alone, so a recomputed token after a
preemption is the same token, whatever shares the batch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from framework.engine.batch import Row
from framework.executors.sampler import SEED_MIX, SEED_MOD, SEED_STEP, draw_seed


class ReplayError(ValueError):
    """A replay file that is missing, malformed, or lacks a request of the workload."""


def read_replay(path: str | Path) -> dict[str, list[int]]:
    """`id -> output_token_ids` from a run's `outputs.jsonl`."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ReplayError(f"executor.replay={path}: no such file")
    out: dict[str, list[int]] = {}
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out[str(rec["id"])] = [int(t) for t in rec["output_token_ids"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplayError(
                f"executor.replay={path}, line {n}: not a line of outputs.jsonl (needs id "
                f"and output_token_ids): {exc}"
            ) from exc
    return out


class TokenStreams:
    def __init__(
        self,
        vocab_size: int,
        eos_token_id: int | None,
        replay: dict[str, list[int]] | None = None,
        mean_output_tokens: float = 128.0,
    ) -> None:
        self.vocab_size = vocab_size
        self.eos = eos_token_id
        self.replay = replay
        self.mean = max(1.0, mean_output_tokens)
        self._length: dict[str, int] = {}
        # Per request, once: its stop set, the salt its draws use, and the request's part of
        # `draw_seed` (`(salt * SEED_MIX + 1) % SEED_MOD`), so that a row's draw adds only its
        # index's part: the same value, without a 128-bit product for every row of every step.
        self._keys: dict[str, tuple[frozenset[int], int, int]] = {}

    def check_covers(self, ids: list[str]) -> None:
        """Every request of the workload must be in the replay: one line naming the first
        that is not (a replay of another workload would silently give other lengths)."""
        if self.replay is None:
            return
        missing = [i for i in ids if i not in self.replay]
        if missing:
            raise ReplayError(
                f"executor.replay lacks {len(missing)} request(s) of the workload, the first "
                f"{missing[0]!r}: replay the outputs.jsonl of a run of the same workload"
            )

    def tokens(self, rows: list[Row]) -> list[int]:
        """Every row's token, in order (0 for a chunk that samples nothing: never read).

        `token` over the rows, with its common case inlined: a request whose stream has no
        stop token left to draw (a trace's `ignore_eos`) and no replay is one hash a row,
        and the simulator runs it for every row of every step."""
        out: list[int] = []
        keys = self._keys
        vocab = self.vocab_size
        plain = self.replay is None
        for row in rows:
            if not row.samples:
                out.append(0)
                continue
            known = keys.get(row.seq_id)
            if plain and known is not None and not known[0]:  # `_filler`, with no stops
                out.append((known[2] + row.token_index * SEED_STEP) % SEED_MOD % vocab)
            else:
                out.append(self.token(row))
        return out

    def token(self, row: Row) -> int:
        key = row.seq_id
        known = self._keys.get(key)
        if known is None:  # per request, once: its stop set and the hash its draws use
            sp = row.sampling
            stop_ids = set(sp.stop_token_ids)
            if not sp.ignore_eos and self.eos is not None:  # as `Sequence.stop_ids`
                stop_ids.add(self.eos)
            salt = sp.seed ^ _hash(key)
            known = self._keys[key] = (frozenset(stop_ids), salt, (salt * SEED_MIX + 1) % SEED_MOD)
        stops, salt, _ = known
        i = row.token_index
        if self.replay is not None and key in self.replay:
            tokens = self.replay[key]
            if i < len(tokens):
                return tokens[i]
            return self._filler(salt, i, stops)
        if stops and i + 1 >= self._output_length(row, salt):
            return min(stops)
        return self._filler(salt, i, stops)

    def _output_length(self, row: Row, salt: int) -> int:
        """A seeded geometric draw with mean `mean_output_tokens`, in [1, max_tokens]."""
        key = row.seq_id
        if key not in self._length:
            u = (draw_seed(salt, 1 << 20) % (1 << 53)) / (1 << 53)
            p = 1.0 / self.mean
            n = 1 + int(math.log1p(-u) / math.log1p(-p)) if p < 1 else 1
            self._length[key] = max(1, min(n, row.sampling.max_tokens))
        return self._length[key]

    def _filler(self, salt: int, index: int, stops: frozenset[int]) -> int:
        """Any token that is not a stop token, a function of (request, index) alone; `salt`
        is the request's seed mixed with its id's hash."""
        token = draw_seed(salt, index) % self.vocab_size
        while token in stops:
            token = (token + 1) % self.vocab_size
        return token


def _hash(text: str) -> int:
    """A stable hash (Python's `hash` of a str changes between processes)."""
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) % (1 << 64)
    return h
