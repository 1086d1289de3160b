"""Preallocated paged K/V storage: per layer, `num_blocks × block_size` slots.

Slot `b * block_size + i` is position i of block b. One extra block at the end is scratch:
rows that must be computed but whose keys nobody keeps (finished rows in a static batch)
write there, so they cost a real forward without touching any live block.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> int:
    """K and V for every layer: what one block costs in memory."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_dim * block_size * itemsize


ALIGN = 4096  # where each CPU layer's keys and values start (a page)


def blocks_in_budget(budget_mb: float, per_block: int) -> int:
    return int(budget_mb * 1024 * 1024) // per_block


def zeroed(
    count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """`count` zeroed tensors of `shape`. On CPU they are views of one block from `calloc`
    (through numpy): the kernel hands out pages that read as zero and are backed only when
    first written, so a pool sized for the worst case costs what the run writes. Why:
    `torch.zeros` writes every byte at once; for the default 256 MB pool that was 0.15-0.6 s of
    every engine's start on the 2-core VMs, whatever the model (the tiny one's included).
    Each view starts on a page (`ALIGN`), as `torch.zeros` started on 64 bytes: `calloc`'s
    block starts 16 bytes into a page, where every 64-byte (AVX-512) load of a head's keys
    would span two cache lines. (On the Zen 3 VM, AVX2, the 48-request chat queue ran level
    either way: aligned over unaligned 0.88-1.04 in four alternating rounds.)"""
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
    itemsize = torch.empty((), dtype=dtype).element_size()
    size = math.prod(shape) * itemsize
    stride = -(-size // ALIGN) * ALIGN
    raw = np.zeros(count * stride + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return [
        torch.from_numpy(raw[start + i * stride : start + i * stride + size])
        .view(dtype)
        .view(shape)
        for i in range(count)
    ]


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = ((num_blocks + 1) * block_size, num_kv_heads, head_dim)  # + the scratch block
        self.k = zeroed(num_layers, shape, dtype, device)
        self.v = zeroed(num_layers, shape, dtype, device)

    @property
    def scratch_block(self) -> int:
        return self.num_blocks

    def slot(self, block_table: list[int], position: int) -> int:
        return (
            block_table[position // self.block_size] * self.block_size + position % self.block_size
        )

    def copy_blocks(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy each (from, to) block's K and V in every layer: one gather and one scatter a
        tensor, whatever the number of blocks (a step's copies on write)."""
        device = self.k[0].device
        src = torch.tensor([a for a, _ in pairs], dtype=torch.long).to(device, non_blocking=True)
        dst = torch.tensor([b for _, b in pairs], dtype=torch.long).to(device, non_blocking=True)
        for t in (*self.k, *self.v):
            blocks = t.view(-1, self.block_size, *t.shape[1:])
            blocks.index_copy_(0, dst, blocks.index_select(0, src))
