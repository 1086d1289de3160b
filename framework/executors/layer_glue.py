"""Which of a model's modules run nanoserve's fused forwards (`fused_llama.py`), and putting
them in and taking them out: RMSNorm, the residual adds, the rotary embedding, the MLP's
SiLU-and-multiply and a decode step's attention as single operators, with the eager modules'
bits.

Why: a SmolLM2 decode step runs about 40 small operators a layer besides its Linear layers;
from Python each costs its dispatch whatever its size, so at batch 1 they made the step 1.4x
its Linear layers. Like the packed Linear layers (`packed_linear.py`), the forwards are
swapped per module instance, so `eager_glue` can put Hugging Face's own back (for its peers),
and only module classes whose arithmetic the operators reproduce are touched.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from framework.executors import fused_llama

MARK = "_nanoserve_glue"
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


def install_glue(model: nn.Module) -> int:
    """Swap the fused forwards in; returns how many modules were swapped."""
    count = 0
    for module in model.modules():
        forward = _forward_for(module, model)
        if forward is not None and not hasattr(module, MARK):
            module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
            setattr(module, MARK, True)
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
    """Run a block with Hugging Face's own module forwards, then fuse again if it was."""
    was = remove_glue(model) > 0
    try:
        yield model
    finally:
        if was:
            install_glue(model)
