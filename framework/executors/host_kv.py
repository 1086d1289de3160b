"""The host tier's K/V tensors, and the copies a step makes between them and the device's
cache (`StepBatch.swaps`; the engine's books are `framework.engine.host_tier`).

Per layer, `num_blocks x block_size` slots of K and of V in host memory, laid out as the
device cache is, so a block is one index of the first dimension of a `[blocks, block_size,
heads, dim]` view. A step's copies are one gather and one scatter per layer and K or V,
whatever the number of blocks: every copy out, then every copy in (the planner's order).

On a CPU both tiers are host memory and a copy is a gather into the other tensor. On CUDA
the host tensors are pinned, and the copies run on a stream of their own: the copies out
wait for the forwards that wrote the blocks, the copies in land before the step's forward
reads them (the compute stream waits for the copy stream). A copy out is read back whole
before its blocks can be given to another request, so the host waits for it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from framework.engine.batch import Swaps
    from framework.engine.kv_cache import KVCache


class HostKV:
    def __init__(self, cache: KVCache, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the host KV tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = bs = cache.block_size
        layer = cache.k[0]
        self.device = layer.device
        cuda = self.device.type == "cuda"
        shape = (num_blocks, bs, *layer.shape[1:])

        def tier() -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=layer.dtype, pin_memory=cuda) for _ in cache.k]

        self.k, self.v = tier(), tier()
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        # Measured copy seconds per block (one way), for the preemption costs: from the
        # copies made so far, and before any from a probe of a few blocks at start.
        self._seconds = 0.0
        self._blocks = 0
        n = min(4, num_blocks, cache.num_blocks)
        self.probe_s = self._timed(cache, [(i, i) for i in range(n)], out=True) / n

    def seconds_per_block(self) -> float:
        return self._seconds / self._blocks if self._blocks else self.probe_s

    def copy(self, cache: KVCache, swaps: Swaps) -> float:
        """The step's copies, out then in; returns their seconds."""
        spent = 0.0
        if swaps.out:
            spent += self._timed(cache, list(swaps.out), out=True)
        if swaps.into:
            spent += self._timed(cache, list(swaps.into), out=False)
        self._seconds += spent
        self._blocks += len(swaps.out) + len(swaps.into)
        return spent

    def _timed(self, cache: KVCache, pairs: list[tuple[int, int]], out: bool) -> float:
        t0 = time.perf_counter()
        src = [a for a, _ in pairs]
        dst = [b for _, b in pairs]
        if self.stream is None:
            self._copy_cpu(cache, src, dst, out)
        else:
            self._copy_cuda(cache, src, dst, out)
        return time.perf_counter() - t0

    def _blocks_of(self, t: torch.Tensor) -> torch.Tensor:
        """A device cache tensor `[slots, heads, dim]` as `[blocks, block_size, heads, dim]`
        (its scratch block included)."""
        return t.view(-1, self.block_size, *t.shape[1:])

    def _copy_cpu(self, cache: KVCache, src: list[int], dst: list[int], out: bool) -> None:
        s, d = torch.tensor(src), torch.tensor(dst)
        for dev, tier in ((cache.k, self.k), (cache.v, self.v)):
            for layer, kept in zip(dev, tier, strict=True):
                blocks = self._blocks_of(layer)
                if out:
                    kept.index_copy_(0, d, blocks.index_select(0, s))
                else:
                    blocks.index_copy_(0, d, kept.index_select(0, s))

    def _copy_cuda(self, cache: KVCache, src: list[int], dst: list[int], out: bool) -> None:
        stream = self.stream
        assert stream is not None
        compute = torch.cuda.current_stream(self.device)
        stream.wait_stream(compute)  # the blocks' last writes (and reads) are done first
        with torch.cuda.stream(stream):
            if out:
                s = torch.tensor(src, device=self.device)
                d = torch.tensor(dst)
                staged = []
                for dev in (cache.k, cache.v):
                    for layer in dev:
                        picked = self._blocks_of(layer).index_select(0, s)
                        pinned = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
                        pinned.copy_(picked, non_blocking=True)
                        staged.append(pinned)
                stream.synchronize()  # on the host before any block is given out again
                for kept, pinned in zip([*self.k, *self.v], staged, strict=True):
                    kept.index_copy_(0, d, pinned)
            else:
                s = torch.tensor(src)
                d = torch.tensor(dst, device=self.device)
                for dev, tier in ((cache.k, self.k), (cache.v, self.v)):
                    for layer, kept_layer in zip(dev, tier, strict=True):
                        picked = kept_layer.index_select(0, s).pin_memory()
                        moved = picked.to(self.device, non_blocking=True)
                        self._blocks_of(layer).index_copy_(0, d, moved)
        compute.wait_stream(stream)  # the forward reads the blocks copied in
