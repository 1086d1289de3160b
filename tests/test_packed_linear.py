"""Packed oneDNN Linear layers compute what PyTorch's stock Linear computes (to fp32 rounding),
for every row count, bucketed or not, and can be taken off and put back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.executors.packed_linear import (
    EXACT_ROWS,
    PACKED,
    bf16_packable,
    can_pack,
    pack_linears,
    rows_bucket,
    stock_linears,
    unpack_linears,
)

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8, bias=False))


def test_buckets_bound_the_shapes_and_never_shrink() -> None:
    sizes = [rows_bucket(r) for r in range(1, 8193)]
    assert all(b >= r for r, b in zip(range(1, 8193), sizes, strict=True))
    small = range(1, EXACT_ROWS + 1)
    assert [rows_bucket(r) for r in small] == list(small)  # decode batches exact
    assert len(set(sizes)) < 110  # 32 exact, 14 multiples of 16, 62 of 128


# oneDNN's bf16 path needs AVX512-BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU keeps bf16 stock.
BF16 = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skipif(not bf16_packable(), reason="oneDNN has no bf16 path on this CPU"),
)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17, 255, 257, 300])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_packed_matches_stock_for_any_row_count(rows: int, dtype: torch.dtype) -> None:
    m = model().to(dtype)
    x = torch.randn(1, rows, 24).to(dtype)
    want = m(x)
    assert pack_linears(m) == 2
    got = m(x)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: a summation order apart, rounded
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_unpack_and_stock_context_restore_the_stock_forward() -> None:
    m = model()
    pack_linears(m)
    assert pack_linears(m) == 0  # already packed: nothing to do
    with stock_linears(m):
        assert not any(hasattr(layer, PACKED) for layer in m)
        assert "forward" not in vars(m[0])
    assert all(hasattr(m[i], PACKED) for i in (0, 2))  # packed again after the block
    assert unpack_linears(m) == 2
    assert "forward" not in vars(m[0])


def test_only_fp32_and_bf16_cpu_models_are_packed() -> None:
    assert can_pack(model())
    assert can_pack(model().to(torch.bfloat16)) is bf16_packable()
    m = model().to(torch.float16)
    assert not can_pack(m)
    assert pack_linears(m) == 0
