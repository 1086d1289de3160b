"""Prefix caching (vLLM's automatic prefix caching): incremental paged allocation, plus reuse
of the K/V of full blocks that earlier requests already computed for the same prompt prefix.

The engine does the caching (`framework/engine/prefix_cache.py`): chained block hashes with
the tokens compared on every hit, reference counts, an LRU of cached free blocks evicted only
when the pool needs one (a prompt's tail before its head). This policy asks for it
(`caches_prefixes`) and prices blocks as `incremental` does; the engine charges a hit on a
block another table holds as no new block, and starts the row's forward after the cached
blocks. A hit covers at most the prompt's length minus one token, so every row computes
its last token itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import hookimpl
from plugins.allocators.incremental import IncrementalAllocator, IncrementalConfig


@dataclass
class PrefixCacheConfig(IncrementalConfig):  # its watermark too
    pass


class PrefixCacheAllocator(IncrementalAllocator):
    """Paged blocks as tokens arrive, and the K/V of shared prompt prefixes reused (hashed
    blocks, LRU)."""

    caches_prefixes = True


@hookimpl
def register_allocators(register) -> None:  # type: ignore[no-untyped-def]
    register("prefix_cache", PrefixCacheAllocator, PrefixCacheConfig)
