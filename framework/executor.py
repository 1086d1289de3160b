"""The model runner: a StepBatch in, sampled token ids (a device tensor) out.

`Executor` is the one seam between the engine and the model. The engine never touches
logits; an executor that simulates costs instead of running a model can replace this one
without changing any policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from framework.batch import StepBatch
from framework.kv_cache import KVCache
from framework.paged_attention import ATTN_NAME, PagedBatch, PrefillRow
from framework.sampler import sample


@dataclass
class ExecResult:
    tokens: torch.Tensor  # [rows] sampled ids, still on the device
    forward_s: float
    sample_s: float


class Executor(Protocol):
    def execute(self, batch: StepBatch) -> ExecResult: ...


class HFExecutor:
    """Runs a Hugging Face causal LM over one packed sequence with paged attention."""

    def __init__(self, model: PreTrainedModel, cache: KVCache, device: torch.device) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        model.set_attn_implementation(ATTN_NAME)

    def _paged(
        self, batch: StepBatch
    ) -> tuple[PagedBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        dec_idx: list[int] = []
        dec_ctx: list[list[int]] = []
        prefills: list[PrefillRow] = []
        for row in batch.rows:
            start = len(ids)
            ids.extend(row.token_ids)
            pos.extend(range(row.start_pos, row.start_pos + len(row.token_ids)))
            slots.extend(row.slots)
            last.append(len(ids) - 1)
            if row.is_decode:
                dec_idx.append(start)
                dec_ctx.append(row.ctx_slots or [])
            else:
                ctx = None if row.ctx_slots is None else torch.tensor(row.ctx_slots, device=dev)
                prefills.append(PrefillRow(start, len(row.token_ids), ctx))
        width = max((len(c) for c in dec_ctx), default=0)
        ctx_t = torch.zeros(len(dec_ctx), width, dtype=torch.long)
        mask = torch.zeros(len(dec_ctx), 1, 1, width, dtype=torch.bool)
        for i, c in enumerate(dec_ctx):
            ctx_t[i, : len(c)] = torch.tensor(c)
            mask[i, 0, 0, : len(c)] = True
        paged = PagedBatch(
            cache=self.cache,
            slot_mapping=torch.tensor(slots, device=dev),
            decode_q_idx=torch.tensor(dec_idx, dtype=torch.long, device=dev),
            decode_ctx_slots=ctx_t.to(dev),
            decode_mask=mask.to(dev),
            prefills=prefills,
        )
        if batch.device_inputs is not None:
            input_ids = batch.device_inputs.reshape(1, -1).to(torch.long)
        else:
            input_ids = torch.tensor([ids], device=dev)
        position_ids = torch.tensor([pos], device=dev)
        keep = torch.tensor(last, device=dev)
        return paged, input_ids, position_ids, keep

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> ExecResult:
        t0 = time.perf_counter()
        paged, input_ids, position_ids, keep = self._paged(batch)
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            logits_to_keep=keep,
            use_cache=False,
            paged=paged,
        )
        logits = out.logits[0]
        t1 = time.perf_counter()
        tokens = sample(logits.float(), batch.rows)
        return ExecResult(tokens=tokens, forward_s=t1 - t0, sample_s=time.perf_counter() - t1)
