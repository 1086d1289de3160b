"""The decoder layer's glue as single operators (`glue.cpp`): RMSNorm, rotary on q and k,
SiLU-and-multiply, each replacing a chain of eager operators whose per-call cost from Python,
not their arithmetic, made them a tenth of a SmolLM2 decode step.
"""

from __future__ import annotations

import torch

from framework.executors.kernels.build import unavailable

DTYPES = (torch.float32, torch.bfloat16)


def why_not(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the glue operators cannot run here, or None when they can."""
    if device.type != "cpu" or dtype not in DTYPES:
        return f"it runs on CPU in float32 or bfloat16 only (this run: {device.type}, {dtype})"
    return unavailable()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm over the last dim: weight * (x * rsqrt(mean(x^2) + eps)) in x's dtype,
    the norm in fp32."""
    return torch.ops.nanoserve.rms_norm(x, weight, eps)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding on q and k ([1, H, T, D], the last dim contiguous) with
    cos, sin [1, T, D]; each result laid out token by token ([T, H, D] in memory), so the
    paged attention's per-token reads are views."""
    return torch.ops.nanoserve.rotary(q, k, cos, sin)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up with eager's roundings."""
    return torch.ops.nanoserve.silu_mul(gate, up)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it: (rms_norm(residual + x), residual + x),
    with eager's roundings."""
    return torch.ops.nanoserve.add_rms_norm(x, residual, weight, eps)
