"""One KV cache and one set of decode graphs per process, lent to one engine at a time.

Why: capturing a bucket's CUDA graph costs a few warm-up forwards and the capture itself,
and a graph is bound to the addresses it read: the model's weights and one KV cache's
tensors. A process that builds many engines over one model (calibration points, the
checks' cases, a study's runs) would pay the capture, and the cache's allocation, for each.
So the cache and the graphs captured over it outlive the engine: the next engine over the
same model, with the same cache geometry, borrows both.

A lease is held while its engine's executor lives (a weak reference); engines running side
by side in one process (an in-process cluster) each get their own. A cache with more blocks
than an engine asks for serves it (the engine's pool uses the first `num_blocks`; the scratch
block is the cache's last), so a calibration sweep's growing pools reuse the largest so far.
A stale K/V value in a lent cache is never read: a slot is written before any query reads
it, and a new engine's prefix cache starts empty.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from framework.engine.kv_cache import KVCache


@dataclass(frozen=True)
class Geometry:
    """What must match for a cache to serve: everything but the number of blocks."""

    layers: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device


@dataclass
class Lease:
    model: weakref.ref[Any]
    geometry: Geometry
    cache: KVCache
    graphs: dict[Any, Any] = field(default_factory=dict)  # by what the capture depends on
    holder: weakref.ref[Any] | None = None

    def free(self) -> bool:
        return self.holder is None or self.holder() is None


_LEASES: list[Lease] = []


class _Taking:
    """The holder of a lease between `lend` and its executor taking it."""


_TAKING = _Taking()


def lend(model: Any, geometry: Geometry, num_blocks: int) -> Lease:
    """A lease on a cache of at least `num_blocks` blocks for `model`, held from now until
    the executor that takes it (`Lease.holder`) is collected. A free one if any (after
    collecting engines that are gone but still in reference cycles), else a new one; free
    smaller ones of the same geometry are dropped then, so their memory returns."""
    lease = _free(model, geometry, num_blocks)
    if lease is None and any(_same(x, model, geometry) for x in _LEASES):
        gc.collect()  # a gone engine's executor may wait in a cycle, holding its lease
        lease = _free(model, geometry, num_blocks)
    if lease is None:
        _LEASES[:] = [
            x
            for x in _LEASES
            if x.model() is not None and not (x.free() and _same(x, model, geometry))
        ]
        g = geometry
        cache = KVCache(
            g.layers, num_blocks, g.block_size, g.kv_heads, g.head_dim, g.dtype, g.device
        )
        lease = Lease(weakref.ref(model), geometry, cache)
        _LEASES.append(lease)
    lease.holder = weakref.ref(_TAKING)  # held until the executor names itself its holder
    return lease


def _same(lease: Lease, model: Any, geometry: Geometry) -> bool:
    return lease.model() is model and lease.geometry == geometry


def _free(model: Any, geometry: Geometry, num_blocks: int) -> Lease | None:
    fits = [
        x
        for x in _LEASES
        if x.free() and _same(x, model, geometry) and x.cache.num_blocks >= num_blocks
    ]
    return min(fits, key=lambda x: x.cache.num_blocks, default=None)


def leases() -> list[Lease]:
    """The process's leases (for tests and `describe`)."""
    return list(_LEASES)
