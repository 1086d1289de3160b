"""Attention through block tables, plugged into Hugging Face models by name.

The model's own modules (projections, rotary, MLP, norms) do everything else; this function
only replaces the attention kernel: it writes this step's K/V into each row's blocks, then
attends every query over its own row's slots. Registered with transformers'
`AttentionInterface`, so any architecture that dispatches through it (Llama, Qwen2, Mistral,
...) runs paged without a hand-written copy of its code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from framework.kv_cache import KVCache

ATTN_NAME = "nanoserve_paged"


@dataclass
class PrefillRow:
    q_start: int  # first packed index of this row's queries
    q_len: int
    ctx_slots: torch.Tensor | None  # all slots to attend over, or None: only its own new tokens


@dataclass
class PagedBatch:
    """Where each packed token's K/V goes and what each query may read.

    Decode rows (one query each) are attended together as one padded batch; prefill rows
    one at a time, causally.
    """

    cache: KVCache
    slot_mapping: torch.Tensor  # [T] slot for each packed token
    decode_q_idx: torch.Tensor  # [Bd] packed index of each decode row's query
    decode_ctx_slots: torch.Tensor  # [Bd, L] slots to attend, padded
    decode_mask: torch.Tensor  # [Bd, 1, 1, L] True where a slot is real
    prefills: list[PrefillRow]


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, Hq, T, D], rotary applied
    key: torch.Tensor,  # [1, Hkv, T, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    paged: PagedBatch | None = None,
    sliding_window: int | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    if paged is None:
        raise RuntimeError(f"{ATTN_NAME} attention called without a PagedBatch (paged=...)")
    layer = module.layer_idx
    k_cache, v_cache = paged.cache.k[layer], paged.cache.v[layer]
    k_new = key[0].transpose(0, 1)  # [T, Hkv, D]
    v_new = value[0].transpose(0, 1)
    k_cache.index_copy_(0, paged.slot_mapping, k_new)
    v_cache.index_copy_(0, paged.slot_mapping, v_new)

    q = query[0]  # [Hq, T, D]
    out = torch.empty_like(q.transpose(0, 1))  # [T, Hq, D]
    if paged.decode_q_idx.numel():
        qd = q[:, paged.decode_q_idx].transpose(0, 1).unsqueeze(2)  # [Bd, Hq, 1, D]
        kd = k_cache[paged.decode_ctx_slots].permute(0, 2, 1, 3)  # [Bd, Hkv, L, D]
        vd = v_cache[paged.decode_ctx_slots].permute(0, 2, 1, 3)
        mask = paged.decode_mask
        if sliding_window:
            # Mistral / Qwen2 sliding layers: the query (last slot) sees the last W positions.
            lens = mask.sum(-1, keepdim=True)
            pos = torch.arange(mask.shape[-1], device=mask.device)
            mask = mask & (pos > lens - 1 - sliding_window)
        od = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=mask, scale=scaling, enable_gqa=True
        )
        out[paged.decode_q_idx] = od.squeeze(2)
    for row in paged.prefills:
        sl = slice(row.q_start, row.q_start + row.q_len)
        qp = q[:, sl].unsqueeze(0)  # [1, Hq, Lq, D]
        if row.ctx_slots is None:
            kp, vp = key[:, :, sl], value[:, :, sl]
            ctx = row.q_len
        else:
            kp = k_cache[row.ctx_slots].transpose(0, 1).unsqueeze(0)
            vp = v_cache[row.ctx_slots].transpose(0, 1).unsqueeze(0)
            ctx = row.ctx_slots.numel()
        if ctx == row.q_len and not (sliding_window and row.q_len > sliding_window):
            op = F.scaled_dot_product_attention(
                qp, kp, vp, is_causal=True, scale=scaling, enable_gqa=True
            )
        else:
            # Query i sits at context position ctx - q_len + i and sees every position up
            # to it (and, on a sliding layer, only the last W of those).
            qpos = torch.arange(ctx - row.q_len, ctx, device=q.device)[:, None]
            kpos = torch.arange(ctx, device=q.device)[None, :]
            mask = kpos <= qpos
            if sliding_window:
                mask = mask & (qpos - kpos < sliding_window)
            op = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=mask, scale=scaling, enable_gqa=True
            )
        out[sl] = op[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, paged_attention)
