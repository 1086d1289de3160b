"""A cached block as a prefix cache's eviction order sees it: a type of the policy contract
(`Allocator.choose_eviction`), below both the contract and the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CachedBlock:
    """A cached, evictable block as an eviction order sees it (`Allocator.choose_eviction`)."""

    block: int
    depth: int  # its place in its prefix: 0 is a prompt's first block
    hits: int  # admissions that shared it since it was published
    freed: int  # when it became evictable, as a count of frees (larger is more recent)
