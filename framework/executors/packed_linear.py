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
packing pays on the CPU at hand is measured, not assumed (`kernel_choice.choose_linears`): on
an Intel Xeon with AMX it made no difference.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

PACKED = "_nanoserve_packed"  # attribute holding a layer's packed weight


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
    packed = getattr(self, PACKED)
    width = x.shape[-1]
    rows = x.numel() // width
    padded = rows_bucket(rows)
    if padded == rows:
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
    flat = torch.cat([x.reshape(rows, width), x.new_zeros(padded - rows, width)])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, self.bias, "none", [], "")[:rows]
    return out.view(*x.shape[:-1], out.shape[-1])


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
            module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
            count += 1
    return count


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: the stock forward again, packed copies dropped."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and hasattr(module, PACKED):
            delattr(module, PACKED)
            del module.forward  # the instance attribute; the class's forward shows through
            count += 1
    return count


@contextmanager
def stock_linears(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with the stock `nn.Linear` forward, then pack again if it was packed."""
    was_packed = unpack_linears(model) > 0
    try:
        yield model
    finally:
        if was_packed:
            pack_linears(model)
