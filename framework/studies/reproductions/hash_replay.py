"""The Mooncake traces' prefix reuse read straight from their `hash_ids`, with no engine: the
reference the engine's runs are compared with, never the source of a reproduced number.

Hash id k of a line names its k-th block of `block_tokens` prompt tokens, and equal ids at
equal depth mean equal prefixes (a trace's ids never repeat at another depth behind another
prefix), so a request's cached prefix is its leading ids seen before, up to the first one
not seen. Two ways of counting its tokens:

- `published`: the paper's replay, every leading block seen counts whole, the last one cut
  to the prompt's length: min(k x block_tokens, input_length);
- `engine`: what nanoserve's prefix cache can hit: only full blocks are ever published, and
  a hit leaves the prompt's last token to compute, so at most (input_length - 1) //
  block_tokens blocks, each of block_tokens tokens.

`lru_share` is an LRU of a given number of blocks over the same sequence (a request's blocks
touched head to tail, so its tail is the most recent): a request larger than the cache passes
through it and flushes it, as in an offline replay of the request sequence alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from framework.workloads.mooncake import MooncakeRow, read_mooncake

RULES = ("published", "engine")


@dataclass(frozen=True)
class ReplayShare:
    """Cached prompt tokens over all prompt tokens of a replay."""

    hit_tokens: int
    prompt_tokens: int

    @property
    def share(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def read_rows(path: Path, limit: int | None) -> list[MooncakeRow]:
    """The trace's first `limit` lines (all when None), parsed and checked as the workload
    parses them."""
    return read_mooncake(path, 0, limit)


def _hit_tokens(row: MooncakeRow, blocks: int, block_tokens: int, rule: str) -> int:
    if rule == "published":
        return min(blocks * block_tokens, row.input_length)
    return min(blocks, max(row.input_length - 1, 0) // block_tokens) * block_tokens


def unbounded_share(rows: Sequence[MooncakeRow], block_tokens: int, rule: str) -> ReplayShare:
    """Every block ever seen kept: the largest share the request sequence allows. Under the
    `engine` rule only a prompt's full blocks become reusable, as in the engine."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}; got {rule!r}")
    seen: set[int] = set()
    hit = total = 0
    for row in rows:
        ids = row.hash_ids
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hit += _hit_tokens(row, k, block_tokens, rule)
        total += row.input_length
        kept = len(ids) if rule == "published" else min(len(ids), row.input_length // block_tokens)
        seen.update(ids[:kept])
    return ReplayShare(hit, total)


def lru_share(rows: Sequence[MooncakeRow], capacity_blocks: int, block_tokens: int) -> ReplayShare:
    """An LRU cache of `capacity_blocks` blocks over the request sequence, counted by the
    `published` rule."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for row in rows:
        ids = row.hash_ids
        k = 0
        while k < len(ids) and ids[k] in cache:
            k += 1
        hit += _hit_tokens(row, k, block_tokens, "published")
        total += row.input_length
        for h in ids:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
                if len(cache) > capacity_blocks:
                    cache.popitem(last=False)
    return ReplayShare(hit, total)
