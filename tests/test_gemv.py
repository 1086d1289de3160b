"""nanoserve's Linear kernel (`kernels/gemv.cpp`: a matrix-vector product at a few rows, tiles
at more): what `torch.nn.functional.linear` computes (to fp32 rounding, bf16 within its
rounding), on both paths and odd row counts, with and without a bias, on sizes no vector width
divides; a row's result the same whatever the batch; the choice's rule and the layers each
rung is timed on; and an engine's greedy tokens on it equal to the stock Linear layers'. No
time is asserted: whether it pays is the machine's (`kernel_choice`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from framework.executors import kernel_choice as kc
from framework.executors import linear_choice as lc
from framework.executors.kernels.build import unavailable
from framework.executors.packed_linear import (
    EVERY_ROW,
    SMALL,
    set_small_rows,
    small_rows,
    stock_linears,
)
from framework.run.config_checks import check_engine
from tests.helpers import make_cfg, random_specs, run_engine, tokens

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    """The kernels are built here, or the module is skipped where they cannot be."""
    import shutil

    reason = unavailable()
    if reason is not None and shutil.which("c++") is None:
        pytest.skip(f"no C++ compiler here: {reason}")
    if reason is not None and "AVX2" in reason:
        pytest.skip(reason)
    assert reason is None, reason


def kernel(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.nanoserve.small_linear(x, w, b)


SIZES = [(1, 1), (7, 5), (8, 16), (16, 33), (576, 192), (577, 191), (1536, 577), (20, 1031)]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 33])
@pytest.mark.parametrize(("k", "n"), SIZES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_linear(rows: int, k: int, n: int, bias: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + k + n)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    got = kernel(x, w, b)
    assert got.shape == (rows, n) and got.dtype == dtype
    # The reference in fp64 over the same (exactly widened) values, then to the dtype.
    want = F.linear(x.double(), w.double(), b.double() if bias else None)
    scale = k**0.5
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * scale)
    else:  # one rounding of the fp32 sum to bf16: within a bf16 unit of the value
        torch.testing.assert_close(got.double(), want, rtol=8e-3, atol=1e-5 * scale)
        stock = F.linear(x, w, b)
        torch.testing.assert_close(got, stock, rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_in_any_batch(dtype: torch.dtype) -> None:
    """Each row's sum runs in one order whatever the row count and path: a row alone (the
    matrix-vector path), in 4 and in 9 (tiles, an odd row and an odd weight row left over)
    agree to the bit, and leading dimensions are kept."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 9, 577, generator=gen).to(dtype)
    w = torch.randn(1031, 577, generator=gen).to(dtype)
    b = torch.randn(1031, generator=gen).to(dtype)
    whole = kernel(x, w, b)
    assert whole.shape == (1, 9, 1031)
    four = kernel(x[:, 3:7], w, b)
    for r in range(9):
        assert torch.equal(kernel(x[:, r : r + 1], w, b), whole[:, r : r + 1])
        if 3 <= r < 7:
            assert torch.equal(four[:, r - 3 : r - 2], whole[:, r : r + 1])


def test_fp32_input_on_bf16_weights_and_bad_calls() -> None:
    w = torch.randn(9, 17).to(torch.bfloat16)
    x = torch.randn(2, 17)
    got = kernel(x, w, None)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, w.float()), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="at least 1 row"):
        kernel(torch.randn(0, 17), w, None)
    with pytest.raises(RuntimeError, match="in_features"):
        kernel(torch.randn(1, 16), w, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel(x, torch.randn(17, 9).t(), None)


def test_layers_use_it_up_to_their_rows_and_give_it_back() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8, bias=False))
    x = {n: torch.randn(n, 24) for n in (1, 2, 3, 8)}
    with torch.inference_mode():
        want = {n: m(v) for n, v in x.items()}
        assert set_small_rows(m, 2) == 2 and small_rows(m) == 2
        for n, v in x.items():
            torch.testing.assert_close(m(v), want[n], rtol=1e-5, atol=1e-5)
            if n > 2:  # above its rows: the stock forward, to the bit
                assert torch.equal(m(v), want[n])
        with stock_linears(m):
            assert small_rows(m) == 0 and "forward" not in m[0].__dict__
        assert small_rows(m) == 2
    assert set_small_rows(m, 0) == 0
    assert not hasattr(m[0], SMALL) and "forward" not in m[0].__dict__


def test_choice_rule_and_settings(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = tiny
    fast, slow = {"kernel": 1.0, "current": 2.0}, {"kernel": 2.0, "current": 1.0}
    rows, choice = lc._measured_small({1: fast, 2: fast, 3: slow})
    assert rows == 2 and choice.use and choice.why.startswith("up to 2 rows; ")
    rows, choice = lc._measured_small({1: slow, 2: fast, 3: fast})
    assert rows == 0 and not choice.use
    rows, choice = lc._measured_small(dict.fromkeys(lc.SMALL_LADDER, fast))
    assert rows == EVERY_ROW and choice.why.startswith("at every row count; ")
    rows, _ = lc._measured_small({n: fast for n in lc.SMALL_LADDER[:-1]})  # the climb not done
    assert rows == lc.SMALL_LADDER[-2]
    off = lc.choose_small_linears(model, "auto", "false")
    assert not off.use and small_rows(model) == 0  # packed_linears=false: stock everywhere
    on = lc.choose_small_linears(model, "true", "false")
    assert on == kc.Choice(True, "set", "at every row count") and small_rows(model) == EVERY_ROW
    monkeypatch.setattr(lc, "_SMALL", {})
    monkeypatch.setattr(lc, "_small_times", lambda m: {1: fast, 2: slow, 3: slow})
    auto = lc.choose_small_linears(model, "auto", "auto")
    assert auto.how == "measured" and small_rows(model) == 1
    assert lc.choose_small_linears(model, False, "auto") == kc.Choice(False, "set", "")
    assert small_rows(model) == 0


def test_a_row_count_pins_the_choice(tiny: tuple[Any, Any]) -> None:
    """`engine.small_linear=N` runs the kernel up to N rows without a climb, and a run's
    reported choice turns back into the setting that reproduces it (an A/B's pinned kernels)."""
    model, _ = tiny
    assert [lc.small_setting(v) for v in ("auto", True, "false", 8, "12")] == [
        None, EVERY_ROW, 0, 8, 12,
    ]  # fmt: skip
    for bad in (0, -3, "eight", 2.5):
        with pytest.raises(ValueError, match=r"engine\.small_linear must be auto .* a row count"):
            lc.small_setting(bad)
    pinned = lc.choose_small_linears(model, 8, "false")  # set wins over packed_linears=false
    assert pinned == kc.Choice(True, "set", "up to 8 rows") and small_rows(model) == 8
    assert lc.small_pin(pinned.said("kernel", "off")) == "8"
    every = lc.choose_small_linears(model, "true", "auto").said("kernel", "off")
    assert lc.small_pin(every) == "true"
    off = lc.choose_small_linears(model, "false", "auto").said("kernel", "off")
    assert lc.small_pin(off) == "false" and small_rows(model) == 0
    measured = "kernel (measured: up to 16 rows; kernel/current ms a pass: 1 rows 2/3)"
    assert lc.small_pin(measured) == "16"
    check_engine(make_cfg("model=tiny", "engine.small_linear=8").engine)  # before any model
    with pytest.raises(ValueError, match=r"engine\.small_linear must be auto"):
        check_engine(make_cfg("model=tiny", "engine.small_linear=maybe").engine)


def test_large_rungs_are_timed_on_the_leading_layers() -> None:
    """Up to `SMALL_WHOLE_ROWS` rows a rung times every layer; above, the fewest leading
    layers whose multiply-adds reach `SMALL_RUNG_MACS`, always one, at most all."""
    layers = [nn.Linear(64, 64, bias=False) for _ in range(16)]
    whole = lc.SMALL_WHOLE_ROWS
    assert lc.rung_layers(layers, 1) == layers == lc.rung_layers(layers, whole)
    per_row = lc.SMALL_RUNG_MACS // 64**2  # rows x layers that make the budget
    assert lc.rung_layers(layers, per_row // 4) == layers[:4]  # 4 make it exactly
    assert lc.rung_layers(layers, per_row // 4 - 1) == layers[:5]
    assert lc.rung_layers(layers, per_row * 1000) == layers[:1]
    assert lc.rung_layers(layers, whole + 1) == layers  # all of them fall short: all


def test_engine_greedy_equals_the_stock_linears(tiny: tuple[Any, Any]) -> None:
    """Batch 1 and 2 decode steps and the prompts' prefill through the kernel give the
    tokens the stock Linear layers give on the tiny model."""
    model, tok = tiny
    specs = random_specs(tok, 3, seed=7, prompt=(1, 4), output=(4, 12))
    common = ("model=tiny", "engine.max_num_seqs=2", "engine.check_invariants=true")
    stock = run_engine(make_cfg(*common, "engine.packed_linears=false"), model, tok, specs)
    on = make_cfg(*common, "engine.packed_linears=false", "engine.small_linear=true")
    ours = run_engine(on, model, tok, specs)
    assert small_rows(model) == EVERY_ROW
    assert tokens(ours) == tokens(stock)
    set_small_rows(model, 0)
