"""The C++ greedy argmax (framework/executors/kernels/argmax.cpp) against torch.argmax: the
same index on every input, ties, signed zeros, infinities and NaNs included, and its choice."""

from __future__ import annotations

import shutil

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from framework.executors import kernel_choice as kc
from framework.executors.kernels.argmax import kernel_argmax, why_not
from framework.executors.sampler import sample

CPU = torch.device("cpu")
SPECIAL = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 3.5, 3.5]


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    reason = why_not(CPU)
    if reason is not None and shutil.which("c++") is None:
        pytest.skip(f"no C++ compiler here: {reason}")  # the engine keeps torch.argmax
    assert reason is None, reason


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 70),  # under, at and past the 8-wide vector, with a tail
    data=st.data(),
)
def test_same_index_as_torch_argmax(rows: int, vocab: int, data: st.DataObject) -> None:
    # Few distinct values, so ties (between lanes, vectors and the tail) are the common case.
    values = st.one_of(st.sampled_from(SPECIAL), st.integers(-3, 3).map(float))
    flat = data.draw(st.lists(values, min_size=rows * vocab, max_size=rows * vocab))
    x = torch.tensor(flat, dtype=torch.float32).view(rows, vocab)
    assert torch.equal(kernel_argmax(x), torch.argmax(x, dim=-1)), x


def test_large_vocabulary_and_many_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(67, 49_152 + 5, generator=gen)
    x[3, 17] = x[3, 40_000] = x[3].max() + 1  # a tie far apart: the first wins
    x[5, 49_156] = float("inf")  # in the tail
    x[7, 9] = float("nan")
    x[7, 20] = float("inf")
    x[9] = float("-inf")
    assert torch.equal(kernel_argmax(x), torch.argmax(x, dim=-1))
    strided = x[:, :1000]  # not contiguous: copied first
    assert torch.equal(kernel_argmax(strided), torch.argmax(strided, dim=-1))


def test_refuses_what_it_does_not_read() -> None:
    with pytest.raises(RuntimeError, match="float32 logits only"):
        kernel_argmax(torch.zeros(2, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="float32 logits only"):
        kernel_argmax(torch.zeros(8))


def test_sampler_uses_the_given_argmax_for_greedy_rows() -> None:
    from framework.core.request import SamplingParams
    from framework.engine.batch import Row

    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(1))
    rows = [Row(f"r{i}", [1], 4, [4], [0], 5, SamplingParams(), 0) for i in range(3)]
    assert torch.equal(sample(logits, rows, kernel_argmax), sample(logits, rows))


def test_choice() -> None:
    assert kc.choose_argmax(False, CPU, 1000) == kc.Choice(False, "set", "")
    assert kc.choose_argmax("true", CPU, 1000).use
    auto = kc.choose_argmax("auto", CPU, 1000)
    assert auto.how == "measured" and "kernel" in auto.why and "torch" in auto.why
    cuda = kc.choose_argmax("auto", torch.device("cuda"), 1000)
    assert not cuda.use and cuda.how == "unavailable" and "CPU only" in cuda.why
    with pytest.raises(ValueError, match=r"^engine.argmax_kernel must be auto .* got 'yes'"):
        kc.choose_argmax("yes", CPU, 1000)
