"""Greedy sampling's argmax on CPU: nanoserve's kernel (`argmax.cpp`) where it is built,
torch's argmax elsewhere. Both give the same index, the first largest (the kernel's tests
check it on ties, infinities and NaNs); on a large vocabulary the kernel is several times
faster (`argmax.cpp` says why; docs/performance.md has the measurements).
"""

from __future__ import annotations

import torch

from framework.executors.kernels.build import unavailable


def kernel_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[rows] int64: each row's argmax of CPU float32 logits, by the kernel."""
    return torch.ops.nanoserve.greedy_argmax(logits.contiguous())


def why_not(device: torch.device) -> str | None:
    """Why the kernel cannot run here, or None when it can: a CPU with AVX2 where nanoserve's
    kernels built."""
    if device.type != "cpu":
        return f"it runs on CPU only (this run: {device.type})"
    return unavailable()
