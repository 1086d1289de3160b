"""Which of a model's modules run nanoserve's fused forwards (`fused_llama.py`), and putting
them in and taking them out: RMSNorm, the residual adds, the rotary embedding, the MLP's
SiLU-and-multiply and a decode step's attention as single operators, with the eager modules'
bits.

Why: a SmolLM2 decode step runs about 40 small operators a layer besides its Linear layers;
from Python each costs its dispatch whatever its size, so at batch 1 they made the step 1.4x
its Linear layers. Like the packed Linear layers (`packed_linear.py`), the forwards are
swapped per module instance, so `eager_glue` can put Hugging Face's own back (for its peers),
and only module classes whose arithmetic the operators reproduce are touched.

Each swapped module holds the backend its forward calls (`fused_llama.Glue`), chosen when it
is installed: nanoserve's C++ operators on CPU, the same four compiled by Inductor into Triton
kernels on CUDA (`kernels/compiled_glue.py`), where each eager operator is a kernel launch.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from framework.executors import fused_llama
from framework.executors.fused_llama import CPP, Glue
from framework.executors.kernels import compiled_glue

MARK = fused_llama.GLUE  # on each swapped module: the backend (`Glue`) its forward calls
COMPILED = "compiled (torch.compile, Triton)"
MODELS = ("LlamaModel",)  # embedding, layers, final norm
LAYERS = ("LlamaDecoderLayer",)  # norm, attention, add; norm, MLP, add
NORMS = ("LlamaRMSNorm",)  # weight * (x * rsqrt(mean(x^2) + eps)), the norm in fp32
MLPS = ("LlamaMLP",)  # down(act(gate(x)) * up(x))
ATTENTIONS = ("LlamaAttention",)  # q/k/v projections, rotary, attention interface, o_proj


def _forward_for(module: nn.Module, model: nn.Module) -> Any:
    """The fused forward for `module`, or None where its arithmetic is not the operators'."""
    name = type(module).__name__
    if name in MODELS and _all_llama(module):
        return fused_llama.model_forward
    if name in LAYERS:
        return fused_llama.layer_forward
    if name in NORMS:
        return fused_llama.norm_forward
    if name in MLPS and getattr(model.config, "hidden_act", None) == "silu":
        return fused_llama.mlp_forward
    if name in ATTENTIONS:  # any rope type: its scaling is in cos and sin, not in the rotation
        return fused_llama.attention_forward
    return None


def _all_llama(model: nn.Module) -> bool:
    """Whether every layer and norm of a model is Llama's own, as the fused loop assumes."""
    layers = getattr(model, "layers", ())
    return type(getattr(model, "norm", None)).__name__ in NORMS and all(
        type(layer).__name__ in LAYERS
        and type(layer.input_layernorm).__name__ in NORMS
        and type(layer.post_attention_layernorm).__name__ in NORMS
        and type(layer.self_attn).__name__ in ATTENTIONS
        for layer in layers
    )


def glue_modules(model: nn.Module) -> int:
    """How many of the model's modules the fused operators can serve."""
    return sum(_forward_for(m, model) is not None for m in model.modules())


@functools.cache
def compiled_backend() -> Glue:
    """The four operators compiled by Inductor (Triton kernels on CUDA); one per process, so
    each shape compiles once whichever model calls it. Never the C++ decode attention."""
    norm, add_norm, rotary, silu_mul = (
        compiled_glue.compiled(fn) for fn in compiled_glue.FUNCTIONS
    )
    return Glue(COMPILED, norm, add_norm, rotary, silu_mul, decode_kernel=False)


def backend_for(device: torch.device) -> Glue:
    """The backend that serves a device: the C++ operators on CPU, the compiled ones else."""
    return CPP if device.type == "cpu" else compiled_backend()


def backend_of(model: nn.Module) -> Glue | None:
    """The backend the model's fused forwards call, or None where none is installed."""
    return next((getattr(m, MARK) for m in model.modules() if hasattr(m, MARK)), None)


def install_glue(model: nn.Module, backend: Glue | None = None) -> int:
    """Swap the fused forwards in, calling `backend` (by default the one for the model's
    device, `backend_for`); returns how many modules were swapped. Modules fused with another
    backend are switched to this one."""
    if backend is None:
        backend = backend_for(next(model.parameters()).device)
    count = 0
    for module in model.modules():
        forward = _forward_for(module, model)
        if forward is not None and getattr(module, MARK, None) is not backend:
            module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
            setattr(module, MARK, backend)
            count += 1
    return count


def remove_glue(model: nn.Module) -> int:
    """Undo `install_glue`: the modules' own forwards again."""
    count = 0
    for module in model.modules():
        if hasattr(module, MARK):
            delattr(module, MARK)
            del module.forward  # the instance attribute; the class's forward shows through
            count += 1
    return count


@contextmanager
def eager_glue(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with Hugging Face's own module forwards, then fuse again (with the same
    backend) if it was."""
    was = backend_of(model)
    remove_glue(model)
    try:
        yield model
    finally:
        if was is not None:
            install_glue(model, was)
