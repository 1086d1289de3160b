"""nanoserve's fused layer glue (framework/executors/kernels/glue.cpp): RMSNorm, rotary and
SiLU-and-multiply give the eager modules' exact bits on any size and dtype, the engine's tokens
are the same with them on and off, and their choice."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from transformers.models.llama import modeling_llama as llama

from framework.executors import kernel_choice as kc
from framework.executors import layer_glue
from framework.executors.kernels import glue
from framework.executors.model_loader import TinySpec, load_model
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, random_specs, run_engine

CPU = torch.device("cpu")
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


pytestmark = pytest.mark.usefixtures("glue_built")


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


@settings(max_examples=120, deadline=None)
@given(
    rows=st.integers(1, 70),
    width=st.integers(1, 1100),  # odd sizes, under and past a vector, SmolLM2's 576
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
)
def test_rms_norm_is_eager_bit_for_bit(rows, width, dtype, seed, scale) -> None:
    norm = llama.LlamaRMSNorm(width, eps=1e-5).to(dtype)
    norm.weight.data = randn(width, dtype=dtype, seed=seed + 1)
    x = randn(1, rows, width, dtype=dtype, seed=seed, scale=scale)
    assert torch.equal(glue.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))


@settings(max_examples=120, deadline=None)
@given(
    tokens=st.integers(1, 70),
    heads=st.integers(1, 9),
    kv=st.integers(1, 3),
    half=st.integers(1, 40),  # head dims 2 to 80, odd halves included
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_rotary_is_eager_bit_for_bit(tokens, heads, kv, half, dtype, seed) -> None:
    d = 2 * half
    # As Llama's attention makes them: [1, T, H, D] projections viewed as [1, H, T, D].
    q = randn(1, tokens, heads, d, dtype=dtype, seed=seed).transpose(1, 2)
    k = randn(1, tokens, kv, d, dtype=dtype, seed=seed + 1).transpose(1, 2)
    angle = randn(1, tokens, d, dtype=torch.float32, seed=seed + 2, scale=30.0)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    got_q, got_k = glue.rotary(q, k, cos, sin)
    ref_q, ref_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)
    assert got_q.transpose(1, 2).is_contiguous()  # laid out token by token
    # Already contiguous [1, H, T, D] inputs (another layout) give the same values.
    got_q2, _ = glue.rotary(q.contiguous(), k.contiguous(), cos, sin)
    assert torch.equal(got_q2, ref_q)


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 70), width=st.integers(1, 1600), dtype=DTYPES, seed=st.integers(0, 99))
def test_silu_mul_is_eager_bit_for_bit(rows, width, dtype, seed) -> None:
    g = randn(1, rows, width, dtype=dtype, seed=seed, scale=4.0)
    u = randn(1, rows, width, dtype=dtype, seed=seed + 1)
    assert torch.equal(glue.silu_mul(g, u), F.silu(g) * u)


def test_refuses_what_it_does_not_read() -> None:
    with pytest.raises(RuntimeError, match="float32 or bfloat16 only"):
        glue.rms_norm(torch.zeros(2, 8, dtype=torch.float16), torch.ones(8).half(), 1e-5)
    with pytest.raises(RuntimeError, match="a weight of the input's dtype"):
        glue.rms_norm(torch.zeros(2, 8), torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="even head dim"):
        glue.rotary(torch.zeros(1, 2, 3, 5), torch.zeros(1, 1, 3, 5), *[torch.zeros(1, 3, 5)] * 2)


def engine_tokens(model, tok, specs, on: bool, dtype: str = "float32") -> dict[str, list[int]]:
    cfg = make_cfg(
        "scheduler=continuous", "allocator=incremental", f"engine.layer_glue={on}", f"dtype={dtype}"
    )
    return {s.id: list(s.output_token_ids) for s in run_engine(cfg, model, tok, specs).seqs}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engine_tokens_are_the_same_with_and_without_the_glue(dtype) -> None:
    model, tok = load_model("tiny", None, None, dtype, CPU, TinySpec())
    specs = random_specs(tok, 6, 7)
    name = str(dtype).removeprefix("torch.")
    runs = {on: engine_tokens(model, tok, specs, on, name) for on in (True, False)}
    assert runs[True] == runs[False]  # the same bits, so the same tokens, in both dtypes
    for s in specs:
        ref = hf_greedy(model, s.prompt_token_ids, s.sampling.max_tokens, None)
        check_same_greedy(model, s.prompt_token_ids, s.id, runs[True][s.id], ref)


def test_choice_installs_and_removes(tiny) -> None:
    model, _ = tiny
    n = layer_glue.glue_modules(model)
    assert n == 1 + 2 * (1 + 2 + 1 + 1) + 1  # the model; a layer, its norms, attention, MLP; a norm
    try:
        assert kc.choose_glue(model, "true", CPU) == kc.Choice(True, "set", "")
        assert sum(hasattr(m, layer_glue.MARK) for m in model.modules()) == n
        with layer_glue.eager_glue(model):
            assert not any(hasattr(m, layer_glue.MARK) for m in model.modules())
        assert sum(hasattr(m, layer_glue.MARK) for m in model.modules()) == n
        assert kc.choose_glue(model, False, CPU) == kc.Choice(False, "set", "")
        assert not any(hasattr(m, layer_glue.MARK) for m in model.modules())
        auto = kc.choose_glue(model, "auto", CPU)
        assert auto.how == "measured" and "eager" in auto.why
        assert any(hasattr(m, layer_glue.MARK) for m in model.modules()) == auto.use
        off = kc.choose_glue(model, "auto", torch.device("cuda"))
        assert not off.use and off.how == "unavailable" and "CPU" in off.why
        with pytest.raises(ValueError, match=r"^engine.layer_glue must be auto .* got 'yes'"):
            kc.choose_glue(model, "yes", CPU)
    finally:
        layer_glue.remove_glue(model)


@pytest.mark.slow
def test_smollm2_tokens_are_the_same_with_and_without_the_glue(smollm2) -> None:
    model, tok = smollm2
    from framework.workloads import build_workload

    specs = build_workload({"kind": "chat", "limit": 4, "max_tokens": 24}, tok)
    try:
        runs = {on: engine_tokens(model, tok, specs, on) for on in (True, False)}
    finally:
        layer_glue.remove_glue(model)
    assert runs[True] == runs[False]
