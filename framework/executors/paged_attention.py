"""Attention through block tables, plugged into Hugging Face models by name.

The model's own modules (projections, rotary, MLP, norms) do everything else; this function
only replaces the attention kernel: it writes this step's K/V into each row's blocks, then
attends every query over its own row's blocks. Registered with transformers'
`AttentionInterface`, so any architecture that dispatches through it (Llama, Qwen2, Mistral,
...) runs paged without a hand-written copy of its code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from framework.engine.kv_cache import KVCache
from framework.executors.flex_paged import FlexDecode, FlexPrefill, flex_decode, flex_prefill
from framework.executors.kernels.paged_decode import paged_decode

ATTN_NAME = "nanoserve_paged"


@dataclass
class PrefillRow:
    q_start: int  # first packed index of this row's queries
    q_len: int
    ctx_slots: torch.Tensor | None  # every slot to attend over, or None: only its new tokens


@dataclass
class PagedBatch:
    """Where each packed token's K/V goes and what each query may read.

    Decode rows (one query each) are attended together: on CPU fp32 by nanoserve's kernel,
    which reads each row's blocks where they lie (`decode_kernel`, framework/executors/kernels/);
    elsewhere as one padded batch through SDPA, after gathering whole blocks (contiguous
    `block_size` slots) rather than single slots. Prefill rows one at a time, causally.
    With `flex_decode` / `flex_prefill` (framework/executors/flex_paged.py) the decode rows,
    or all the prefill rows, are one `flex_attention` call each, over blocks where they lie.
    """

    cache: KVCache
    slot_mapping: torch.Tensor  # [T] slot for each packed token
    decode_q_idx: torch.Tensor  # [Bd] packed index of each decode row's query
    decode_blocks: torch.Tensor  # [Bd, nb] each decode row's block table, padded
    decode_lens: torch.Tensor  # [Bd, 1, 1, 1] positions each decode row attends to
    # [Bd, 1, 1, nb * block_size] True where a position is real; None for the kernel (lengths)
    decode_mask: torch.Tensor | None
    prefills: list[PrefillRow]
    decode_kernel: bool = False  # decode rows through framework/kernels (CPU), blocks in place
    flex_decode: FlexDecode | None = None  # decode rows through flex_attention
    flex_prefill: FlexPrefill | None = None  # every prefill row in one flex_attention call


def _decode(
    qd: torch.Tensor,  # [Bd, Hq, 1, D]: each decode row's query
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    paged: PagedBatch,
    scaling: float | None,
    sliding_window: int | None,
) -> torch.Tensor:
    bs = paged.cache.block_size
    if paged.flex_decode is not None:
        return flex_decode(qd, k_cache, v_cache, paged.flex_decode, scaling, sliding_window)
    if paged.decode_kernel:
        scale = scaling if scaling is not None else qd.shape[-1] ** -0.5
        lens = paged.decode_lens.view(-1)
        return paged_decode(
            qd.squeeze(2), k_cache, v_cache, paged.decode_blocks, lens, bs, scale, sliding_window
        )
    mask = paged.decode_mask
    assert mask is not None, "the gather + SDPA path needs decode_mask"
    if sliding_window:
        # Mistral / Qwen2 sliding layers: the query (position len-1) sees the last W positions.
        pos = torch.arange(mask.shape[-1], device=mask.device)
        mask = mask & (pos > paged.decode_lens - 1 - sliding_window)
    return sdpa_decode(qd, k_cache, v_cache, paged.decode_blocks, bs, mask, scaling)


def sdpa_decode(
    qd: torch.Tensor,  # [Bd, Hq, 1, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks: torch.Tensor,  # [Bd, nb] each row's block table, padded
    block_size: int,
    mask: torch.Tensor,  # [Bd, 1, 1, nb * block_size] True where a row attends
    scaling: float | None,
) -> torch.Tensor:
    """The portable decode path: every row's blocks gathered into one padded batch, then
    SDPA. [Bd, Hq, D]."""
    bd, nb = blocks.shape
    heads, dim = k_cache.shape[1], k_cache.shape[2]
    # index_select on the block axis, not advanced indexing: one contiguous copy per block,
    # several times faster on CPU (docs/measurements/code-notes.md).
    flat = blocks.reshape(-1)
    kd = k_cache.view(-1, block_size, heads, dim).index_select(0, flat)
    vd = v_cache.view(-1, block_size, heads, dim).index_select(0, flat)
    kd = kd.view(bd, nb * block_size, heads, dim).transpose(1, 2)
    vd = vd.view(bd, nb * block_size, heads, dim).transpose(1, 2)
    od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scaling, enable_gqa=True)
    return od.squeeze(2)


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
    # Hugging Face's attention module: `layer_idx` is an int (nn.Module's stub types what a
    # subclass does not declare as Tensor | Module)
    layer: int = module.layer_idx  # type: ignore[assignment]
    k_cache, v_cache = paged.cache.k[layer], paged.cache.v[layer]
    k_cache.index_copy_(0, paged.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, paged.slot_mapping, value[0].transpose(0, 1))

    q = query[0]  # [Hq, T, D]
    if not paged.prefills:  # decode only: token i is decode row i, no gather or scatter
        qd = q.transpose(0, 1).unsqueeze(2)
        return _decode(qd, k_cache, v_cache, paged, scaling, sliding_window).unsqueeze(0), None
    out = torch.empty_like(q.transpose(0, 1))  # [T, Hq, D]
    if paged.decode_q_idx.numel():
        qd = q[:, paged.decode_q_idx].transpose(0, 1).unsqueeze(2)  # [Bd, Hq, 1, D]
        out[paged.decode_q_idx] = _decode(qd, k_cache, v_cache, paged, scaling, sliding_window)
    plan = paged.flex_prefill
    if plan is not None:
        op = flex_prefill(q, k_cache, v_cache, plan, scaling, sliding_window)
        if plan.q_index is None:  # the step is all prefill rows
            return op.unsqueeze(0), None
        out[plan.q_index] = op
        return out.unsqueeze(0), None
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
