"""The layer glue's compiled backend (framework/executors/kernels/compiled_glue.py), meant for
CUDA and checked here on CPU: its functions are Hugging Face's chains, compiled they stay
within rounding of them without a recompile per token count, a tiny Llama fused with them
gives Hugging Face's greedy tokens through the engine (never reaching the C++ decode
attention), and `choose_glue` picks it on CUDA only."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama as llama

from framework.executors import fused_llama, layer_glue
from framework.executors import kernel_choice as kc
from framework.executors.kernels import compiled_glue as cg
from framework.executors.model_loader import TinySpec, load_model
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, random_specs, run_engine

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
DTYPES = [torch.float32, torch.bfloat16]


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def norm_of(width: int, dtype: torch.dtype, seed: int) -> llama.LlamaRMSNorm:
    norm = llama.LlamaRMSNorm(width, eps=1e-5).to(dtype)
    norm.weight.data = randn(width, dtype=dtype, seed=seed)
    return norm


def qk_cos_sin(tokens: int, heads: int, kv: int, d: int, dtype: torch.dtype, seed: int):
    """q and k as Llama's attention makes them ([1, T, H, D] projections viewed as
    [1, H, T, D]), and cos, sin [1, T, D]."""
    q = randn(1, tokens, heads, d, dtype=dtype, seed=seed).transpose(1, 2)
    k = randn(1, tokens, kv, d, dtype=dtype, seed=seed + 1).transpose(1, 2)
    angle = randn(1, tokens, d, dtype=torch.float32, seed=seed + 2, scale=30.0)
    return q, k, angle.cos().to(dtype), angle.sin().to(dtype)


# ---- the reference functions: Hugging Face's chains, run eagerly --------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "width", "scale"), [(1, 64, 1.0), (13, 576, 300.0), (5, 7, 1e-3)])
def test_norms_are_hugging_faces(dtype, rows, width, scale) -> None:
    norm = norm_of(width, dtype, seed=rows)
    x = randn(1, rows, width, dtype=dtype, seed=width, scale=scale)
    residual = randn(1, rows, width, dtype=dtype, seed=width + 1, scale=scale)
    assert torch.equal(cg.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))
    normed, total = cg.add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)
    assert torch.equal(total, residual + x)  # the decoder layer's `residual + hidden_states`
    assert torch.equal(normed, norm(residual + x))
    assert normed.dtype == total.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "kv", "d"), [(1, 4, 2, 16), (9, 3, 1, 10)])
def test_rotary_is_hugging_faces(dtype, tokens, heads, kv, d) -> None:
    q, k, cos, sin = qk_cos_sin(tokens, heads, kv, d, dtype, seed=tokens)
    got_q, got_k = cg.rotary(q, k, cos, sin)
    ref_q, ref_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)
    assert got_q.transpose(1, 2).is_contiguous()  # token by token, as the C++ operator's


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_hugging_faces(dtype) -> None:
    gate = randn(1, 6, 192, dtype=dtype, seed=0, scale=4.0)
    up = randn(1, 6, 192, dtype=dtype, seed=1)
    act = llama.ACT2FN["silu"]  # what LlamaMLP's act_fn is for hidden_act="silu"
    assert torch.equal(cg.silu_mul(gate, up), act(gate) * up)


# ---- compiled (Inductor's C++ on this CPU; Triton on CUDA) --------------------------------
def glue_calls(tokens: int, dtype: torch.dtype, seed: int) -> dict[str, tuple]:
    """Each operator's arguments at a token count, the weight a norm's own (a Parameter)."""
    width, inter = 64, 128  # the tiny Llama's, whose graphs the engine test below then reuses
    norm = norm_of(width, dtype, seed=3)
    x = randn(1, tokens, width, dtype=dtype, seed=seed)
    residual = randn(1, tokens, width, dtype=dtype, seed=seed + 10)
    gate, up = (randn(1, tokens, inter, dtype=dtype, seed=seed + s) for s in (20, 30))
    return {
        "rms_norm": (x, norm.weight, norm.variance_epsilon),
        "add_rms_norm": (x, residual, norm.weight, norm.variance_epsilon),
        "rotary": qk_cos_sin(tokens, 4, 2, 16, dtype, seed=seed + 40),
        "silu_mul": (gate, up),
    }


@pytest.mark.parametrize(
    ("dtype", "names", "tol"),
    [
        (torch.float32, ("rms_norm", "add_rms_norm", "rotary", "silu_mul"), 1e-5),
        (torch.bfloat16, ("rms_norm", "add_rms_norm"), 1.6e-2),  # bf16's rounding
    ],
)
def test_compiled_is_the_reference_at_any_token_count(dtype, names, tol) -> None:
    """Within rounding of the reference at each count; counts after the first (over 1, which
    Dynamo specialises) reuse the one graph: a recompile there would raise. The inputs are
    made in inference mode, as the engine's are (another dispatch key, another graph)."""
    fns = {fn.__name__: cg.compiled(fn) for fn in cg.FUNCTIONS}
    assert cg.compiled(cg.rms_norm) is fns["rms_norm"]  # one wrapper per process
    for i, tokens in enumerate((3, 11, 6)):
        with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=i > 0):
            calls = glue_calls(tokens, dtype, seed=i)
            for name in names:
                got, ref = fns[name](*calls[name]), getattr(cg, name)(*calls[name])
                torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


# ---- the backend in the model -------------------------------------------------------------
def counted(backend: fused_llama.Glue, calls: dict[str, int]) -> fused_llama.Glue:
    """`backend` with each call of its operators counted by name."""

    def wrap(name: str):
        fn = getattr(backend, name)

        def call(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call

    names = ("rms_norm", "add_rms_norm", "rotary", "silu_mul")
    return backend._replace(**{name: wrap(name) for name in names})


@pytest.mark.usefixtures("glue_built")
def test_tiny_llama_with_the_compiled_glue_gives_hugging_faces_tokens(monkeypatch) -> None:
    """Through the engine, with the compiled backend forced on CPU (the seam `_glue_backend`)
    and the C++ decode kernel chosen: every step's glue is the compiled operators', the C++
    decode attention is never reached, the tokens are Hugging Face's, and taking the glue out
    leaves the model's own forwards."""
    model, tok = load_model("tiny", None, None, torch.float32, CPU, TinySpec())
    calls: dict[str, int] = {}
    backend = counted(layer_glue.compiled_backend(), calls)
    monkeypatch.setattr(kc, "_glue_backend", lambda device, dtype: (backend, None))

    def refused(*args, **kwargs):
        raise AssertionError("the compiled backend reached the C++ decode attention")

    monkeypatch.setattr(fused_llama, "decode_attention", refused)
    specs = random_specs(tok, 4, 11, prompt=(1, 12), output=(4, 12))
    cfg = make_cfg(
        "scheduler=continuous",
        "allocator=incremental",
        "engine.layer_glue=auto",
        "engine.paged_kernel=true",
        "engine.packed_linears=false",  # no Linear forward swapped, nor its timing
    )
    try:
        result = run_engine(cfg, model, tok, specs)
        assert layer_glue.backend_of(model) is backend
        assert set(calls) == {"rms_norm", "add_rms_norm", "rotary", "silu_mul"}
        ours = {s.id: list(s.output_token_ids) for s in result.seqs}
        for s in specs:
            ref = hf_greedy(model, s.prompt_token_ids, s.sampling.max_tokens, None)
            check_same_greedy(model, s.prompt_token_ids, s.id, ours[s.id], ref)
        assert layer_glue.backend_of(model) is backend  # eager_glue put the same one back
    finally:
        assert layer_glue.remove_glue(model) == layer_glue.glue_modules(model)
    for module in model.modules():  # each module's class forward shows through again
        assert "forward" not in vars(module) and not hasattr(module, layer_glue.MARK)
    assert layer_glue.glue_modules(model) > 0


# ---- which backend, and the choice --------------------------------------------------------
def test_install_picks_switches_and_restores_the_backend(tiny) -> None:
    model, _ = tiny
    n = layer_glue.glue_modules(model)
    compiled = layer_glue.compiled_backend()
    assert not compiled.decode_kernel and fused_llama.CPP.decode_kernel
    assert layer_glue.backend_for(CPU) is fused_llama.CPP
    assert layer_glue.backend_for(CUDA) is compiled
    before = layer_glue.backend_of(model)  # the shared model, as an earlier engine left it
    layer_glue.remove_glue(model)
    try:
        assert layer_glue.install_glue(model) == n  # the model's device: CPU, so C++
        assert layer_glue.backend_of(model) is fused_llama.CPP
        assert layer_glue.install_glue(model) == 0
        assert layer_glue.install_glue(model, compiled) == n  # switched, every module
        assert all(
            getattr(m, layer_glue.MARK) is compiled
            for m in model.modules()
            if hasattr(m, layer_glue.MARK)
        )
        with layer_glue.eager_glue(model):
            assert layer_glue.backend_of(model) is None
        assert layer_glue.backend_of(model) is compiled
    finally:
        layer_glue.remove_glue(model)
    assert layer_glue.backend_of(model) is None
    if before is not None:
        layer_glue.install_glue(model, before)


@pytest.mark.usefixtures("glue_built")
def test_choice_on_cpu_is_the_measured_cpp_glue(tiny) -> None:
    model, _ = tiny
    try:
        auto = kc.choose_glue(model, "auto", CPU)
        assert auto.how == "measured" and "eager" in auto.why
        assert layer_glue.backend_of(model) is (fused_llama.CPP if auto.use else None)
        assert kc.choose_glue(model, True, CPU) == kc.Choice(True, "set", "")
        assert layer_glue.backend_of(model) is fused_llama.CPP
    finally:
        layer_glue.remove_glue(model)


def test_choice_on_cuda_is_the_compiled_glue_where_it_can_compile(tiny, monkeypatch) -> None:
    model, _ = tiny
    compiled = layer_glue.compiled_backend()
    assert "CUDA" in cg.why_not(CPU, torch.float32)
    monkeypatch.setattr(cg, "why_not", lambda device, dtype: None)  # as on a GPU with Triton
    try:
        auto = kc.choose_glue(model, "auto", CUDA)
        assert auto == kc.Choice(True, "default", layer_glue.COMPILED)
        assert auto.said("fused", "eager") == "fused (default: compiled (torch.compile, Triton))"
        assert layer_glue.backend_of(model) is compiled
        assert kc.choose_glue(model, "false", CUDA) == kc.Choice(False, "set", "")
        assert layer_glue.backend_of(model) is None
        assert kc.choose_glue(model, "true", CUDA) == kc.Choice(True, "set", layer_glue.COMPILED)
        assert layer_glue.backend_of(model) is compiled

        monkeypatch.setattr(cg, "why_not", lambda device, dtype: "no Triton")  # as without
        for value in ("auto", "true"):
            off = kc.choose_glue(model, value, CUDA)
            assert not off.use and off.how == "unavailable" and off.why.endswith("no Triton")
            assert layer_glue.backend_of(model) is None
    finally:
        layer_glue.remove_glue(model)
