"""The decoder layer's glue through nanoserve's fused operators (`kernels/glue.cpp`): each
RMSNorm, the rotary embedding of q and k, and the MLP's SiLU-and-multiply become one operator
call each, on the model's own modules, with the same bits as the eager modules.

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

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from framework.executors.kernels import glue

MARK = "_nanoserve_glue"
NORMS = ("LlamaRMSNorm",)  # weight * (x * rsqrt(mean(x^2) + eps)), the norm in fp32
MLPS = ("LlamaMLP",)  # down(act(gate(x)) * up(x))
ATTENTIONS = ("LlamaAttention",)  # q/k/v projections, rotary, attention interface, o_proj


def _norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return glue.rms_norm(x, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(glue.silu_mul(self.gate_proj(x), self.up_proj(x)))


def _attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """Llama's attention forward with the rotary embedding as one operator (for one packed
    sequence, as the engine runs it; a padded batch takes the eager rotary)."""
    shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    if q.shape[0] == 1 and cos.shape[0] == 1:
        q, k = glue.rotary(q, k, cos, sin)
    else:
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    impl = self.config._attn_implementation
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward)
    out, weights = attend(
        self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
    )
    out = out.reshape(*hidden_states.shape[:-1], -1).contiguous()
    return self.o_proj(out), weights


def _forward_for(module: nn.Module, model: nn.Module) -> Any:
    """The fused forward for `module`, or None where its arithmetic is not the operators'."""
    name = type(module).__name__
    if name in NORMS:
        return _norm_forward
    if name in MLPS and getattr(model.config, "hidden_act", None) == "silu":
        return _mlp_forward
    if name in ATTENTIONS:  # any rope type: its scaling is in cos and sin, not in the rotation
        return _attention_forward
    return None


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
