"""The decoder layer's glue for CUDA: the four operators of `glue.py` (RMSNorm, the residual
add and RMSNorm, rotary on q and k, SiLU-and-multiply) as small torch functions, each compiled
by Inductor into one Triton kernel.

Why: on a GPU every eager operator is a kernel launch, and at decode sizes the launch is its
whole cost: Llama's RMSNorm is eight of them, rotary on q and k fourteen, SiLU-and-multiply
two. The C++ operators (`glue.cpp`) are CPU code; on CUDA Inductor writes the fused kernels.

Numerics: the functions are Hugging Face's chains, the same operators in the same order, so
run eagerly they give its bits. Compiled, Inductor keeps the intermediates of a bf16 chain in
fp32 and may fuse a multiply and an add, so the results agree within the dtype's rounding,
not bit for bit.

Shapes: compiled with `dynamic=True`, so the token count, which changes every step, is a
symbol and a new count does not recompile. Dynamo still specialises a size of 1: a step of one
token is its own graph, compiled once. No function syncs with the host or has a shape that
depends on data, so after a warm-up call (which compiles) they can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
import torch.nn.functional as F

P = ParamSpec("P")
R = TypeVar("R")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm over the last dim: weight * (x * rsqrt(mean(x^2) + eps)), the norm in
    fp32, the result in x's dtype before the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it: (rms_norm(residual + x), residual + x)."""
    total = residual + x
    return rms_norm(total, weight, eps), total


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) (Hugging Face's)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding on q and k ([B, H, T, D]) with cos, sin [B, T, D], as
    `apply_rotary_pos_emb`. Each result keeps its input's layout: from the attention's
    projections, token by token ([T, H, D] in memory), as the C++ operator lays them out."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up: Llama's MLP between its projections."""
    return F.silu(gate) * up


FUNCTIONS = (rms_norm, add_rms_norm, rotary, silu_mul)


@functools.cache
def compiled(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` compiled by Inductor, one wrapper per process (so one cache of compiled graphs):
    the whole function one graph (`fullgraph`), the sizes symbols (`dynamic`). Lazy: nothing
    compiles before the first call."""
    return torch.compile(fn, dynamic=True, fullgraph=True)


def why_not(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the compiled operators cannot serve here, or None when they can: CUDA, with
    Triton for Inductor to write the kernels in."""
    if device.type != "cuda":
        return f"compiled for CUDA only (this run: {device.type})"
    if not dtype.is_floating_point:
        return f"floating-point models only (this run: {dtype})"
    from torch.utils._triton import has_triton

    if not has_triton():
        return "no Triton for torch.compile on this GPU (not installed, or compute capability < 7)"
    return None
