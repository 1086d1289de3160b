"""The fused decode attention (framework/executors/kernels/decode_attention.cpp) gives, bit for
bit, what its steps give one by one (the rotary operator, the K/V writes, the paged decode
kernel), leaves the caches as they leave them, and refuses what it does not read; the fused
add-and-norm gives eager's `norm(residual + x)`; and a step of decode rows alone, which is
where the engine uses the fused attention, gives Hugging Face's tokens."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from transformers.models.llama import modeling_llama as llama

from framework.executors import fused_llama, layer_glue
from framework.executors.kernels import glue
from framework.executors.kernels.paged_decode import decode_attention, paged_decode
from framework.executors.model_loader import TinySpec, load_model
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, random_specs, run_engine

CPU = torch.device("cpu")
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


pytestmark = pytest.mark.usefixtures("glue_built")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def step_case(
    rows: int, heads: int, kv: int, dim: int, bs: int, max_len: int, dtype, seed: int, lens=None
):
    """One decode step's operands: each row's new token at the end of its context (`lens`,
    or drawn up to `max_len`), on blocks drawn at random from a pool with room for every row."""
    rng = random.Random(seed)
    lens = lens or [rng.randint(1, max_len) for _ in range(rows)]
    per_row = -(-max_len // bs)
    free = list(range(rows * per_row + 2))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // bs))] for n in lens]
    width = max(map(len, tables))
    blocks = torch.zeros(rows, width, dtype=torch.long)
    for i, t in enumerate(tables):
        blocks[i, : len(t)] = torch.tensor(t)
    last = zip(tables, lens, strict=True)
    slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in last])
    g = gen(seed)
    q = torch.randn(1, rows, heads * dim, generator=g).to(dtype)
    k = torch.randn(1, rows, kv * dim, generator=g).to(dtype)
    v = torch.randn(1, rows, kv * dim, generator=g).to(dtype)
    angle = 30 * torch.randn(1, rows, dim, generator=g)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    slots_total = (rows * per_row + 2) * bs
    k_cache = torch.randn(slots_total, kv, dim, generator=g).to(dtype)
    v_cache = torch.randn(slots_total, kv, dim, generator=g).to(dtype)
    lengths = torch.tensor(lens).view(-1, 1, 1, 1)
    return q, k, v, cos, sin, k_cache, v_cache, slots, blocks, lengths


def one_by_one(q, k, v, cos, sin, k_cache, v_cache, slots, blocks, lens, bs, scale):
    """The unfused steps, as the attention forward runs them without the fused operator."""
    rows, dim, kv = q.shape[1], k_cache.shape[-1], k_cache.shape[1]
    q4 = q.view(1, rows, -1, dim).transpose(1, 2)
    k4 = k.view(1, rows, kv, dim).transpose(1, 2)
    qr, kr = glue.rotary(q4, k4, cos, sin)
    k_cache.index_copy_(0, slots, kr[0].transpose(0, 1))
    v_cache.index_copy_(0, slots, v.view(rows, kv, dim))
    qd = qr[0].transpose(0, 1)
    out = paged_decode(qd, k_cache, v_cache, blocks, lens.view(-1), bs, scale, None)
    return out.reshape(1, rows, -1)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    kv=st.integers(1, 3),
    group=st.integers(1, 4),
    dim=st.sampled_from([8, 16, 24, 64, 128]),
    bs=st.sampled_from([1, 4, 16]),
    max_len=st.integers(1, 300),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_decode_attention_is_its_steps_bit_for_bit(
    rows, kv, group, dim, bs, max_len, dtype, seed
) -> None:
    case = step_case(rows, kv * group, kv, dim, bs, max_len, dtype, seed)
    q, k, v, cos, sin, kc, vc, slots, blocks, lens = case
    scale = dim**-0.5
    kc2, vc2 = kc.clone(), vc.clone()
    ref = one_by_one(q, k, v, cos, sin, kc, vc, slots, blocks, lens, bs, scale)
    got = decode_attention(q, k, v, cos, sin, kc2, vc2, slots, blocks, lens, bs, scale, None)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(got, ref)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)  # the same slots written, the same bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_at_the_longest_context(dtype) -> None:
    # SmolLM2's shapes at its longest context (8,192 positions) beside a short row.
    case = step_case(2, 9, 3, 64, 16, 8192, dtype, 5, lens=[8192, 37])
    q, k, v, cos, sin, kc, vc, slots, blocks, lens = case
    kc2, vc2 = kc.clone(), vc.clone()
    ref = one_by_one(q, k, v, cos, sin, kc, vc, slots, blocks, lens, 16, 0.125)
    got = decode_attention(q, k, v, cos, sin, kc2, vc2, slots, blocks, lens, 16, 0.125, None)
    assert torch.equal(got, ref) and torch.equal(kc2, kc) and torch.equal(vc2, vc)


def test_decode_attention_refuses_what_it_does_not_read() -> None:
    q, k, v, cos, sin, kc, vc, slots, blocks, lens = step_case(2, 4, 2, 16, 4, 9, torch.float32, 0)
    call = decode_attention
    with pytest.raises(RuntimeError, match="every operand in q's dtype"):
        call(q, k.bfloat16(), v, cos, sin, kc, vc, slots, blocks, lens, 4, 0.25, None)
    with pytest.raises(RuntimeError, match="whole heads"):
        call(q[..., :-8], k, v[..., :-8], cos, sin, kc, vc, slots, blocks, lens, 4, 0.25, None)
    with pytest.raises(RuntimeError, match="outside the cache"):
        bad = slots.clone()
        bad[0] = kc.shape[0]
        call(q, k, v, cos, sin, kc, vc, bad, blocks, lens, 4, 0.25, None)
    with pytest.raises(RuntimeError, match="one int64 slot a token"):
        call(q, k, v, cos, sin, kc, vc, slots[:1], blocks, lens, 4, 0.25, None)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(1, 70),
    width=st.integers(1, 1100),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
)
def test_add_rms_norm_is_eager_bit_for_bit(rows, width, dtype, seed, scale) -> None:
    norm = llama.LlamaRMSNorm(width, eps=1e-5).to(dtype)
    g = gen(seed)
    norm.weight.data = torch.randn(width, generator=g).to(dtype)
    x = (scale * torch.randn(1, rows, width, generator=g)).to(dtype)
    residual = (scale * torch.randn(1, rows, width, generator=g)).to(dtype)
    got, total = glue.add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)
    assert torch.equal(total, residual + x)
    assert torch.equal(got, norm(residual + x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_give_hugging_faces_tokens(dtype, monkeypatch) -> None:
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return decode_attention(*args, **kwargs)

    monkeypatch.setattr(fused_llama, "decode_attention", counted)
    model, tok = load_model("tiny", None, None, dtype, CPU, TinySpec())
    hf_loop = []  # calls of Hugging Face's own model loop, which the fused loop replaces
    own = type(model.model).forward
    monkeypatch.setattr(
        type(model.model), "forward", lambda *a, **k: hf_loop.append(1) or own(*a, **k)
    )
    # All at once, short prompts, long outputs: most steps are decode rows alone, where the
    # fused attention runs.
    specs = random_specs(tok, 5, 3, prompt=(1, 12), output=(8, 40))
    name = str(dtype).removeprefix("torch.")
    runs = {}
    try:
        for on in (True, False):
            calls.clear()
            cfg = make_cfg(
                "scheduler=continuous",
                "allocator=incremental",
                f"engine.layer_glue={on}",
                "engine.paged_kernel=true",
                f"dtype={name}",
            )
            result = run_engine(cfg, model, tok, specs)
            runs[on] = {s.id: list(s.output_token_ids) for s in result.seqs}
            assert bool(calls) == on  # the fused attention served the decode steps
            assert bool(hf_loop) != on  # and the fused loop every step
            hf_loop.clear()
        assert runs[True] == runs[False]
        for s in specs:
            ref = hf_greedy(model, s.prompt_token_ids, s.sampling.max_tokens, None)
            check_same_greedy(model, s.prompt_token_ids, s.id, runs[True][s.id], ref)
            # generate with the fused forwards installed: a call the fused model loop does
            # not serve (a cache, a mask) takes Hugging Face's own loop, with the same bits.
            assert fused_generate(model, s.prompt_token_ids, s.sampling.max_tokens) == ref
    finally:
        layer_glue.remove_glue(model)


def fused_generate(model, prompt: list[int], max_new: int) -> list[int]:
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    layer_glue.install_glue(model)
    try:
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=0,
        )
    finally:
        layer_glue.remove_glue(model)
        model.set_attn_implementation(previous)
    return out[0, len(prompt) :].tolist()
