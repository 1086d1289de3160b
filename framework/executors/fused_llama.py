"""Llama's module forwards through nanoserve's fused operators, each with the eager module's
bits (or, compiled, within its rounding); `layer_glue.py` decides which modules get them and
which backend (`Glue`) each calls: the C++ operators on CPU (`kernels/glue.cpp`,
`kernels/decode_attention.cpp`), the compiled ones on CUDA (`kernels/compiled_glue.py`).

- A norm, the MLP's SiLU-and-multiply and the rotary embedding of q and k: one call each.
- A step of decode rows alone on the paged kernel (C++, CPU): the attention from the q/k/v
  projections to o's input (rotary, the K/V writes, scores, softmax, values) in one call a
  layer. Other backends go through the attention interface (`paged_attention.py`).
- The model's layer loop carries the residual from one layer to the next, so every residual
  add is one call with the norm after it (vLLM's fused add-and-norm), and nothing that the
  engine's paged attention does not read (the causal mask) is built.

Why: from Python each small operator costs its dispatch and a fresh tensor whatever its size;
at batch 1 those made a SmolLM2 decode step 1.4x its Linear layers. The Linear layers stay
module calls (packed or stock, and visible to forward hooks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from framework.executors.kernels import glue
from framework.executors.kernels.paged_decode import decode_attention
from framework.executors.paged_attention import ATTN_NAME

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

GLUE = "_nanoserve_glue"  # each swapped module's `Glue`, set by `layer_glue.install_glue`


class Glue(NamedTuple):
    """The four operators one backend gives the forwards, chosen when they are installed."""

    name: str
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    decode_kernel: bool  # a step of decode rows alone may take the C++ decode attention


CPP = Glue("C++", glue.rms_norm, glue.add_rms_norm, glue.rotary, glue.silu_mul, True)


# Hugging Face's Llama modules as the forwards below read them. `nn.Module` types every
# attribute it does not declare as `Tensor | Module`; these say what each one is.
class _Fused(Protocol):
    _nanoserve_glue: Glue  # `GLUE`: the backend this module's forward calls


class _Norm(_Fused, Protocol):
    weight: torch.Tensor
    variance_epsilon: float


class _MLP(_Fused, Protocol):
    gate_proj: nn.Module
    up_proj: nn.Module
    down_proj: nn.Module

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...


class _Attention(_Fused, Protocol):
    config: PreTrainedConfig
    layer_idx: int
    head_dim: int
    scaling: float
    q_proj: nn.Module
    k_proj: nn.Module
    v_proj: nn.Module
    o_proj: nn.Module

    def __call__(self, **kwargs: Any) -> tuple[torch.Tensor, Any]: ...
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]: ...


class _Layer(_Fused, Protocol):
    input_layernorm: _Norm
    post_attention_layernorm: _Norm
    self_attn: _Attention
    mlp: _MLP


class _Model(_Fused, Protocol):
    config: PreTrainedConfig
    embed_tokens: nn.Module
    rotary_emb: nn.Module
    layers: Sequence[_Layer]
    norm: _Norm

    def forward(self, **kwargs: Any) -> BaseModelOutputWithPast: ...


def norm_forward(self: _Norm, x: torch.Tensor) -> torch.Tensor:
    return self._nanoserve_glue.rms_norm(x, self.weight, self.variance_epsilon)


def mlp_forward(self: _MLP, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(self._nanoserve_glue.silu_mul(self.gate_proj(x), self.up_proj(x)))


def layer_forward(
    self: _Layer,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Llama's decoder layer with the residual add after attention and the norm after it in
    one operator; its submodules run their own (fused) forwards."""
    g: Glue = self._nanoserve_glue
    first, second = self.input_layernorm, self.post_attention_layernorm
    h = g.rms_norm(hidden_states, first.weight, first.variance_epsilon)
    h, _ = self.self_attn(
        hidden_states=h,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    h, residual = g.add_rms_norm(h, hidden_states, second.weight, second.variance_epsilon)
    return residual + self.mlp(h)


def attention_forward(
    self: _Attention,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """Llama's attention forward with the rotary embedding as one operator (for one packed
    sequence, as the engine runs it; a padded batch takes the eager rotary), and a step of
    decode rows alone, on the paged kernel, as one operator from the projections to o (C++
    backend only: that kernel is CPU code)."""
    g: Glue = self._nanoserve_glue
    paged = kwargs.get("paged")
    if (
        g.decode_kernel
        and paged is not None
        and paged.decode_kernel
        and not paged.prefills
        and cache is None
        and self.config._attn_implementation == ATTN_NAME
    ):
        cos, sin = position_embeddings
        layer = self.layer_idx
        out = decode_attention(
            self.q_proj(hidden_states),
            self.k_proj(hidden_states),
            self.v_proj(hidden_states),
            cos,
            sin,
            paged.cache.k[layer],
            paged.cache.v[layer],
            paged.slot_mapping,
            paged.decode_blocks,
            paged.decode_lens,
            paged.cache.block_size,
            self.scaling,
            None,
        )
        return self.o_proj(out), None
    shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    if q.shape[0] == 1 and cos.shape[0] == 1:
        q, k = g.rotary(q, k, cos, sin)
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


def model_forward(
    self: _Model,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    inputs_embeds: torch.Tensor | None = None,
    use_cache: bool | None = None,
    **kwargs: Any,
) -> BaseModelOutputWithPast:
    """Llama's model forward for the engine's paged step: the embedding, then each layer as
    norm, attention, norm, MLP with every residual add inside the next norm's call, then the
    final norm. Any other call (a cache, a mask, embeddings, outputs asked for) is Hugging
    Face's own forward."""
    paged = kwargs.get("paged")
    if (
        paged is None
        or len(kwargs) > 1
        or use_cache
        or cache is not None
        or attention_mask is not None
        or inputs_embeds is not None
        or input_ids is None
        or position_ids is None
    ):
        return type(self).forward(
            self,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
    g: Glue = self._nanoserve_glue
    rms_norm, add_rms_norm = g.rms_norm, g.add_rms_norm
    h = self.embed_tokens(input_ids)
    rope = self.rotary_emb(h, position_ids=position_ids)
    residual: torch.Tensor | None = None
    layers = self.layers
    for i in range(self.config.num_hidden_layers):
        layer = layers[i]
        norm = layer.input_layernorm
        if residual is None:
            residual, h = h, rms_norm(h, norm.weight, norm.variance_epsilon)
        else:
            h, residual = add_rms_norm(h, residual, norm.weight, norm.variance_epsilon)
        h, _ = layer.self_attn.forward(h, rope, paged=paged)
        norm = layer.post_attention_layernorm
        h, residual = add_rms_norm(h, residual, norm.weight, norm.variance_epsilon)
        h = layer.mlp.forward(h)
    norm = self.norm
    if residual is None:
        h = rms_norm(h, norm.weight, norm.variance_epsilon)
    else:
        h, _ = add_rms_norm(h, residual, norm.weight, norm.variance_epsilon)
    return BaseModelOutputWithPast(last_hidden_state=h)
