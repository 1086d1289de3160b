"""Decode attention that reads KV blocks in place: when the kernel can serve, and calling it.

The kernel (`paged_decode.cpp`) is built with nanoserve's other CPU kernels on first use
(`build.py`). It reads a float32 or a bfloat16 cache (widening bf16 to fp32 as it reads; the
arithmetic is fp32 either way). Where it cannot be used (no compiler, no AVX2, not the CPU,
another dtype, an odd head size) the engine keeps the portable gather + SDPA path and says
why once.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

from framework.executors.kernels.build import FLAGS, unavailable

__all__ = ["FLAGS", "SOURCE", "available", "paged_decode", "why_not"]

SOURCE = Path(__file__).with_name("paged_decode.cpp")  # alone, as experiments.kernel_ab builds it
KV_DTYPES = (torch.float32, torch.bfloat16)  # the cache dtypes it reads


def why_not(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the kernel cannot serve this model here, or None when it can."""
    if device.type != "cpu" or dtype not in KV_DTYPES:
        return f"it runs on CPU in float32 or bfloat16 only (this run: {device.type}, {dtype})"
    if head_dim % 8:
        return f"head size {head_dim} is not a multiple of 8"
    return unavailable()


def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel serves this model here; warns once with the reason when it should
    have (a CPU fp32 or bf16 model) but cannot. Other devices and dtypes take the portable
    path silently: it is theirs by design."""
    if device.type != "cpu" or dtype not in KV_DTYPES:
        return False
    reason = why_not(device, dtype, head_dim)
    if reason is not None:
        _warn_once(reason)
    return reason is None


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(
        f"engine.paged_kernel: using gather + SDPA for decode attention: {reason}", stacklevel=3
    )


def paged_decode(
    q: torch.Tensor,  # [rows, Hq, D]: each decode row's query
    k_cache: torch.Tensor,  # [slots, Hkv, D]: one layer's keys
    v_cache: torch.Tensor,
    blocks: torch.Tensor,  # [rows, nb] int64: each row's block table, padded
    lens: torch.Tensor,  # [rows] int64: positions each row attends to
    block_size: int,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """[rows, Hq, D]: each row's attention over its own blocks (the last `window` positions
    on a sliding layer), in `q`'s dtype; scores, softmax and sums in fp32."""
    ops = torch.ops.nanoserve
    w = window or 0
    qf = q.float().contiguous()  # a no-op copy in fp32; bf16 queries widened once
    scores = ops.paged_scores(qf, k_cache, blocks, lens, block_size, scale, w)
    out = ops.paged_mix(torch.softmax(scores, -1), v_cache, blocks, lens, block_size, w)
    return out.to(q.dtype)


def decode_attention(
    q: torch.Tensor,  # [1, T, Hq * D]: this step's query projections, one decode row a token
    k: torch.Tensor,  # [1, T, Hkv * D]
    v: torch.Tensor,
    cos: torch.Tensor,  # [1, T, D]
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [slots, Hkv, D]: one layer's keys, written at `slots`
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [T] int64
    blocks: torch.Tensor,  # [T, nb] int64
    lens: torch.Tensor,  # T int64, any shape
    block_size: int,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """A decode-only step's attention for one layer in one call (`decode_attention.cpp`):
    rotary on q and k, k and v written into their slots, then `paged_decode`'s arithmetic.
    [1, T, Hq * D] in q's dtype, the same bits as those steps taken one by one."""
    return torch.ops.nanoserve.decode_attention(
        q, k, v, cos, sin, k_cache, v_cache, slots, blocks, lens, block_size, scale, window or 0
    )
