"""Which kernel runs, where the answer depends on the machine: chosen by a short measurement
on the CPU the engine finds, unless the user sets it.

Why measure: the same choice went opposite ways on the machines this project has run on.
Prepacked oneDNN Linear layers beat PyTorch's stock ones on a 2-core AMD EPYC with AVX2 only
(where stock goes to MKL's slow small-M sgemm) and were within noise on an Intel Xeon with
AMX; the paged decode kernel beat gather + SDPA by a wide margin in fp32 on AVX2 (figures:
docs/measurements/code-notes.md). A rule
written on one machine is a guess on the next, so each choice here is timed on this one, on
the run's own model, dtype and thread count, in alternating rounds (a slow spell of a shared
machine falls on both sides), and kept for the process.

Each choice is reported (`HFExecutor.describe`, so `metrics.json` and MLflow): what runs, how
it was decided (`measured`, `set` by `engine.packed_linears` / `engine.small_linear` /
`engine.paged_kernel` / `engine.argmax_kernel`, `engine.layer_glue`, `engine.flex_decode` /
`engine.flex_prefill`, `default` where the device decides unmeasured, or `unavailable` with
the reason) and the timings it was decided on. The Linear layers' two choices live in
`linear_choice`, on this module's rules.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from framework.executors import flex_paged, layer_glue
from framework.executors.fused_llama import CPP, Glue
from framework.executors.kernels import argmax, compiled_glue, glue
from framework.executors.kernels.paged_decode import available, paged_decode, why_not

if TYPE_CHECKING:
    from transformers import PreTrainedModel

AUTO = "auto"
ROUNDS = 3  # alternating rounds per choice; the best of each side's rounds counts
REPEAT = 5  # calls per timed round of a short kernel (a layer's attention is ~1 ms)
FLEX_KEYS = ("flex_decode", "flex_prefill")  # flex_attention: chosen by device, not timed


@dataclass(frozen=True)
class Choice:
    use: bool
    how: str  # measured | set | unavailable | default (by device, unmeasured)
    why: str  # the timings it was decided on, or why there was no choice

    def said(self, on: str, off: str) -> str:
        return f"{on if self.use else off} ({self.how}{': ' + self.why if self.why else ''})"


def setting(value: Any, key: str) -> bool | None:
    """`engine.<key>` as True / False, or None for `auto`; a ValueError naming the field
    for anything else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return None
    if text in ("true", "false"):
        return text == "true"
    auto = "chosen by a measurement on this machine"
    if key in FLEX_KEYS:
        auto = "flex_attention on CUDA, today's path elsewhere"
    elif key == "layer_glue":
        auto = "measured on CPU, compiled on CUDA"
    raise ValueError(f"engine.{key} must be auto ({auto}), true or false; got {value!r}")


def best_of(
    fns: dict[str, Callable[[], Any]], rounds: int = ROUNDS, repeat: int = 1
) -> dict[str, float]:
    """Each function's best seconds per call over `rounds` alternating rounds of `repeat`
    calls, after one untimed call each (first-call setup: oneDNN primitives, allocator
    pools). The order alternates (A B, B A, ...), so neither side always runs first."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            for _ in range(repeat):
                fns[name]()
            best[name] = min(best[name], (time.perf_counter() - t) / repeat)
    return best


# ---- decode attention ---------------------------------------------------------------------
def choose_decode_kernel(
    value: Any,
    device: torch.device,
    dtype: torch.dtype,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
) -> Choice:
    """nanoserve's paged decode kernel, or the portable gather + SDPA path."""
    want = setting(value, "paged_kernel")
    if want is False:
        return Choice(False, "set", "")
    if not available(device, dtype, head_dim):  # warns once where it should serve but cannot
        return Choice(False, "unavailable", why_not(device, dtype, head_dim) or "")
    if want:
        return Choice(True, "set", "")
    shape = (dtype, q_heads, kv_heads, head_dim, block_size, torch.get_num_threads())
    return _measured_decode(*shape)


@functools.lru_cache(maxsize=16)
@torch.inference_mode()
def _measured_decode(
    dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int, block_size: int, threads: int
) -> Choice:
    """One layer's decode attention for 16 rows over 256 positions each, both ways."""
    from framework.executors.paged_attention import sdpa_decode

    rows, ctx = 16, 256
    nb = ctx // block_size
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(rows * nb * block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(rows * nb * block_size, kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(rows, q_heads, head_dim, generator=gen).to(dtype)
    blocks = torch.randperm(rows * nb, generator=gen).view(rows, nb)
    lens = torch.full((rows,), ctx, dtype=torch.long)
    mask = torch.ones(rows, 1, 1, nb * block_size, dtype=torch.bool)
    scale = head_dim**-0.5
    return _kernel_or(
        lambda: paged_decode(q, k, v, blocks, lens, block_size, scale, None),
        lambda: sdpa_decode(q.unsqueeze(2), k, v, blocks, block_size, mask, scale),
        "gather + SDPA",
        f"per layer at {rows} rows x {ctx} positions",
    )


def _kernel_or(
    kernel: Callable[[], Any], other: Callable[[], Any], other_name: str, where: str
) -> Choice:
    """A short kernel against the path it would replace, in alternating rounds: the faster."""
    t = best_of({"kernel": kernel, "other": other}, rounds=5, repeat=REPEAT)
    why = f"kernel {1e3 * t['kernel']:.3g} ms, {other_name} {1e3 * t['other']:.3g} ms {where}"
    return Choice(t["kernel"] < t["other"], "measured", why)


# ---- flex_attention: decode rows, and prefill rows in one call ----------------------------


def choose_flex(value: Any, key: str, device: torch.device, block_size: int) -> Choice:
    """`flex_attention` over the blocks where they lie (framework/executors/flex_paged.py)
    for the decode rows (`key` flex_decode) or every prefill row at once (flex_prefill), or
    today's path. The default follows the device, untimed: on CUDA, compiled, it is the path
    meant to serve there (each row's blocks read in place, one kernel a call). Elsewhere it
    runs eager, scoring each query against the whole pool, and compiled it costs a compile
    per shape: today's paths stay the default there."""
    want = setting(value, key)
    if want is False:
        return Choice(False, "set", "")
    eager = flex_paged.why_not_compiled(device)
    if want:
        return Choice(True, "set", f"eager: {eager}" if eager else "compiled")
    if device.type != "cuda":
        return Choice(False, "default", eager or "")
    reason = eager or flex_paged.why_not_block_size(block_size)
    if reason:
        return Choice(False, "unavailable", reason)
    return Choice(True, "default", "compiled; the CUDA path")


# ---- greedy argmax ------------------------------------------------------------------------
def choose_argmax(value: Any, device: torch.device, vocab: int) -> Choice:
    """nanoserve's argmax kernel for the greedy rows, or torch.argmax: the same index either
    way, so only the time differs."""
    want = setting(value, "argmax_kernel")
    if want is False:
        return Choice(False, "set", "")
    reason = argmax.why_not(device)
    if reason is not None:
        return Choice(False, "unavailable", reason)
    if want:
        return Choice(True, "set", "")
    return _measured_argmax(vocab, torch.get_num_threads())


@functools.lru_cache(maxsize=16)
@torch.inference_mode()
def _measured_argmax(vocab: int, threads: int) -> Choice:
    """16 rows of fp32 logits over the model's vocabulary, both ways."""
    rows = 16
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    return _kernel_or(
        lambda: argmax.kernel_argmax(logits),
        lambda: torch.argmax(logits, dim=-1),
        "torch",
        f"at {rows} rows x {vocab}",
    )


# ---- the layer glue: RMSNorm, rotary, SiLU-and-multiply -----------------------------------
def choose_glue(model: PreTrainedModel, value: Any, device: torch.device) -> Choice:
    """nanoserve's fused glue operators in the model's norms, attention and MLPs, or Hugging
    Face's eager chains; and do it (or undo it) on this model object. On CPU the C++
    operators, the same bits as eager (`framework/executors/layer_glue.py`), so only the time
    differs and auto measures it. On CUDA the compiled ones, on by default untimed: there each
    eager operator is a kernel launch and the compiled glue one launch in place of up to
    fourteen, and timing them would mean compiling them here, before the engine's warm-up."""
    want = setting(value, "layer_glue")
    dtype = next(model.parameters()).dtype
    backend, reason = _glue_backend(device, dtype)
    if reason is None and not layer_glue.glue_modules(model):
        reason = "no module of a kind the fused operators reproduce (Llama's)"
    if want is False or backend is None or reason is not None:
        layer_glue.remove_glue(model)
        if want is False:
            return Choice(False, "set", "")
        assert reason is not None  # `_glue_backend` says why wherever it gives no backend
        return Choice(False, "unavailable", reason)
    if backend is not CPP:
        layer_glue.install_glue(model, backend)
        return Choice(True, "set" if want else "default", backend.name)
    if want:
        layer_glue.install_glue(model, backend)
        return Choice(True, "set", "")
    cfg = model.config
    choice = _measured_glue(
        dtype, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads,
        torch.get_num_threads(),
    )  # fmt: skip
    layer_glue.install_glue(model, backend) if choice.use else layer_glue.remove_glue(model)
    return choice


def _glue_backend(device: torch.device, dtype: torch.dtype) -> tuple[Glue | None, str | None]:
    """The glue backend for a device and dtype, or why there is none: the C++ operators on
    CPU, the compiled ones on CUDA with Triton. (The seam a test on CPU replaces.)"""
    if device.type == "cpu":
        return CPP, glue.why_not(device, dtype)
    reason = compiled_glue.why_not(device, dtype)
    if reason is None:
        return layer_glue.compiled_backend(), None
    return None, f"the C++ operators serve CPU only, and the compiled ones not here: {reason}"


@functools.lru_cache(maxsize=16)
@torch.inference_mode()
def _measured_glue(
    dtype: torch.dtype, hidden: int, inter: int, heads: int, kv: int, dim: int, threads: int
) -> Choice:
    """One layer's glue (a norm, a residual add and a norm, rotary on q and k,
    SiLU-and-multiply) at 1 and 16 rows, fused and eager (Hugging Face's own functions)."""
    from transformers.models.llama import modeling_llama as llama

    norm = llama.LlamaRMSNorm(hidden).to(dtype)
    cases = []
    for rows in (1, 16):
        gen = torch.Generator().manual_seed(rows)
        x = torch.randn(1, rows, hidden, generator=gen).to(dtype)
        q = torch.randn(1, rows, heads, dim, generator=gen).to(dtype).transpose(1, 2)
        k = torch.randn(1, rows, kv, dim, generator=gen).to(dtype).transpose(1, 2)
        cos = torch.randn(1, rows, dim, generator=gen).to(dtype)
        g, u = (torch.randn(1, rows, inter, generator=gen).to(dtype) for _ in range(2))
        cases.append((x, q, k, cos, g, u))

    def eager() -> None:
        for x, q, k, cos, g, u in cases:
            norm(x), norm(x + x), llama.apply_rotary_pos_emb(q, k, cos, cos), F.silu(g) * u

    def fused() -> None:
        w, eps = norm.weight, norm.variance_epsilon
        for x, q, k, cos, g, u in cases:
            glue.rms_norm(x, w, eps), glue.add_rms_norm(x, x, w, eps)
            glue.rotary(q, k, cos, cos), glue.silu_mul(g, u)

    return _kernel_or(fused, eager, "eager", "a layer's glue at 1 and 16 rows")
