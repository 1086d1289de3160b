"""The model's Linear layers through prepacked oneDNN weights, on CPU in float32 or bfloat16.

Why: on this project's reference CPU (AMD EPYC, AVX2) PyTorch's default fp32 `linear` goes to
MKL, whose small-M sgemm (M = rows in a decode step) re-reads the weight poorly; oneDNN on
weights packed once into its blocked layout takes a fraction of its time at decode sizes
(figures: docs/measurements/code-notes.md). A decode step is almost all Linear work, so this
is the largest single lever on the forward.

The packed copy is made once per layer (so the weights are held twice); the layer's own
`weight` stays, for tied embeddings and for anything else that reads it. `unpack_linears`
puts the stock forward back, e.g. to time plain Hugging Face on the same model object.
Results differ from MKL's by fp32 rounding only (a different summation order). Whether the
packing pays on the CPU at hand is measured, not assumed (`linear_choice.choose_linears`): on
an Intel Xeon with AMX it made no difference.

Up to some row count the same forward can hand the layer to nanoserve's Linear kernel
instead (`kernels/gemv.cpp`), on the layer's own weight: at a few rows (decode at batch 1 or 2)
oneDNN's small-M path read the weights at a fraction of the memory's speed, and in bf16 on a
CPU without a bf16 matrix unit PyTorch's bf16 Linear ran at a quarter of the kernel's speed at
every row count. Up to how many rows is a layer attribute (`set_small_rows`; `EVERY_ROW` for
all), chosen by measurement too (`linear_choice.choose_small_linears`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

PACKED = "_nanoserve_packed"  # attribute holding a layer's packed weight
SMALL = "_nanoserve_small_rows"  # up to how many rows a layer runs nanoserve's Linear kernel
EVERY_ROW = sys.maxsize  # `SMALL` for a layer that runs it at every row count


def can_pack(model: nn.Module) -> bool:
    """oneDNN is in this torch build, and the model is float32 on the CPU, or bfloat16 on a
    CPU that oneDNN's bf16 path runs on (whether packing pays is measured,
    `framework.executors.kernel_choice`)."""
    param = next(model.parameters())
    if not torch.backends.mkldnn.is_available() or param.device.type != "cpu":
        return False
    return packable(param.dtype)


def packable(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of `dtype` on this CPU: float32 always, bfloat16 where its
    bf16 path runs (`bf16_packable`)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_packable())


def bf16_packable() -> bool:
    """Whether oneDNN packs and multiplies bfloat16 weights on this CPU: on x86 it needs
    AVX512-BW/VL/DQ or AVX-NE-CONVERT. On an AVX2-only CPU (the project's Zen 3 VM) packing a
    bf16 weight raises, while the stock bf16 Linear still runs."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


EXACT_ROWS = 32  # row counts served unpadded: every decode batch of up to 32 rows


def rows_bucket(rows: int) -> int:
    """The row count a linear call is padded to: exact up to `EXACT_ROWS` (decode batches,
    where padded rows and the copy that adds them cost a real share), then multiples of 16
    to 256, then of 128.

    oneDNN keeps state for every input shape it has seen; an engine step's row count is its
    token count, which takes hundreds of values over a run. Measured on the tiny model's
    soak, unbucketed shapes grew the resident set by ~300 MB and made each new shape's first
    step slow; a few dozen buckets bound both. Up to 32 rows the count is exact: a padded
    count copies the rows beside zeros in every Linear call and multiplies the padding too,
    which the default job (up to 16 rows) measurably paid (figures:
    docs/measurements/code-notes.md).
    """
    if rows <= EXACT_ROWS:
        return rows
    step = 16 if rows <= 256 else 128
    return -(-rows // step) * step


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    width = x.shape[-1]
    rows = x.numel() // width
    if 0 < rows <= getattr(self, SMALL, 0) and not torch.is_grad_enabled():
        return torch.ops.nanoserve.small_linear(x, self.weight, self.bias)
    packed = getattr(self, PACKED, None)
    if packed is None:  # nanoserve's kernel on a stock layer: stock above its rows
        return F.linear(x, self.weight, self.bias)
    padded = rows_bucket(rows)
    if padded == rows:
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
    flat = torch.cat([x.reshape(rows, width), x.new_zeros(padded - rows, width)])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, self.bias, "none", [], "")[:rows]
    return out.view(*x.shape[:-1], out.shape[-1])


def _refresh(module: nn.Linear) -> None:
    """The layer's forward follows its attributes: `_packed_forward` while it has a packed
    weight or small rows, the class's own (stock) forward otherwise."""
    if hasattr(module, PACKED) or hasattr(module, SMALL):
        module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
    elif "forward" in module.__dict__:
        del module.forward  # the instance attribute; the class's forward shows through


def small_layers(model: nn.Module) -> list[nn.Linear]:
    """The Linear layers nanoserve's Linear kernel takes: on the CPU, fp32 or bf16, a
    contiguous weight, and a bias (if any) of the weight's dtype."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.Linear)
        and m.weight.device.type == "cpu"
        and m.weight.dtype in (torch.float32, torch.bfloat16)
        and m.weight.is_contiguous()
        and (m.bias is None or (m.bias.dtype == m.weight.dtype and m.bias.is_contiguous()))
    ]


def set_small_rows(model: nn.Module, rows: int) -> int:
    """Run the model's Linear layers through nanoserve's Linear kernel at up to `rows` rows
    (0: never; `EVERY_ROW`: always); the kernels must be built (`kernels.build.unavailable`).
    Returns how many layers take it."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and hasattr(module, SMALL):
            delattr(module, SMALL)
            _refresh(module)
    if rows > 0:
        for module in small_layers(model):
            setattr(module, SMALL, rows)
            _refresh(module)
            count += 1
    return count


def small_rows(model: nn.Module) -> int:
    """Up to how many rows the model's Linear layers run nanoserve's Linear kernel (0: never)."""
    layers = (m for m in model.modules() if isinstance(m, nn.Linear))
    return max((getattr(m, SMALL, 0) for m in layers), default=0)


def pack_linears(model: nn.Module, rows_hint: int = 16) -> int:
    """Give every CPU fp32 / bf16 `nn.Linear` a packed weight and a forward that uses it.

    `rows_hint` is oneDNN's guess at the input's row count; measured on SmolLM2's shapes, any
    hint from 2 to 64 serves every row count from 1 to 512 within noise. Returns how many
    layers were packed (0 where oneDNN is missing or the model is not on the CPU in fp32 or
    bf16).
    """
    if not can_pack(model):
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and not hasattr(module, PACKED):
            weight = module.weight.detach()
            setattr(module, PACKED, torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint))
            _refresh(module)
            count += 1
    return count


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: the packed copies dropped, and the stock forward again (above the
    Linear kernel's rows, where a layer has them)."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and hasattr(module, PACKED):
            delattr(module, PACKED)
            _refresh(module)
            count += 1
    return count


@contextmanager
def stock_linears(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with the stock `nn.Linear` forward, then pack again if it was packed, and
    give back the Linear kernel's rows."""
    rows = small_rows(model)
    set_small_rows(model, 0)
    was_packed = unpack_linears(model) > 0
    try:
        yield model
    finally:
        if was_packed:
            pack_linears(model)
        set_small_rows(model, rows)
