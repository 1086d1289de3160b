"""What a swap's copies of KV blocks cost on a simulated machine (`engine.host_kv_memory_mb`,
`preemption.mode=swap`), priced from its host link (`links.yaml`: a hardware spec's
`host_link`, or `executor.host_link`).

vLLM's swap copies block by block: `swap_blocks` issues one `cudaMemcpyAsync` per block, and
the cache engine calls it for each layer's K and V, so B blocks are 2 x layers x B copies.
Each copy pays the link's per-copy latency, and the bytes cross at its bandwidth: small
blocks are many small copies, which is why the vLLM paper finds swapping slow at block size
1 and comparable to recomputing at 16-64 (section 7.3, Fig. 19). The pool is one GPU's
shard of the KV heads, and each GPU of a tensor-parallel replica copies its shard over its
own link at once, so one shard's bytes are what is priced.

A fork's copy on write (`framework.core.sample_group`) stays on the device: vLLM batches a
step's block copies into one kernel (`copy_blocks`), which reads and writes each block once
at the device's memory bandwidth (`BlockCopyCost`).
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.executors.simulated.links import LinkSpec


@dataclass(frozen=True)
class SwapCost:
    link: LinkSpec
    copies_per_block: int  # 2 x layers: K and V of every layer, one copy each
    block_bytes: int  # one GPU's shard of a block's K and V, every layer

    def seconds(self, blocks: int) -> float:
        """Seconds to copy `blocks` blocks one way."""
        if blocks <= 0:
            return 0.0
        per_copy = blocks * self.copies_per_block * self.link.latency
        return per_copy + blocks * self.block_bytes / self.link.bandwidth

    def describe(self) -> str:
        gb = self.link.bandwidth / 1e9
        us = self.link.latency * 1e6
        n = self.copies_per_block
        return f"{self.link.name}: {gb:g} GB/s each way, {us:g} us a copy, {n} copies a block"


@dataclass(frozen=True)
class BlockCopyCost:
    """A step's copies of KV blocks within the device: one launch, then every block read and
    written at the device memory's `bandwidth` (bytes/s)."""

    bandwidth: float
    launch_s: float
    block_bytes: int

    def seconds(self, blocks: int) -> float:
        if blocks <= 0:
            return 0.0
        return self.launch_s + 2 * blocks * self.block_bytes / self.bandwidth

    def describe(self) -> str:
        return f"{self.bandwidth / 1e9:g} GB/s, {self.launch_s * 1e6:g} us a step's copies"
