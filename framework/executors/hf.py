"""The model runner for Hugging Face causal LMs: a StepBatch in, sampled token ids (a device
tensor) out. It implements the engine's `Executor` protocol (`framework.engine.executor`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import PreTrainedModel

from framework.engine.batch import HELD, StepBatch
from framework.engine.executor import ExecResult
from framework.engine.kv_cache import KVCache
from framework.executors.kernel_choice import AUTO, choose_decode_kernel, choose_linears
from framework.executors.paged_attention import ATTN_NAME, PagedBatch, PrefillRow
from framework.executors.sampler import sample


class HFExecutor:
    """Runs a Hugging Face causal LM over one packed sequence with paged attention."""

    def __init__(
        self,
        model: PreTrainedModel,
        cache: KVCache,
        device: torch.device,
        packed_linears: Any = AUTO,
        paged_kernel: Any = AUTO,
    ) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        model.set_attn_implementation(ATTN_NAME)
        # The model object may be shared (tests, benchmarks): each engine states its own way,
        # measured on this machine unless set (auto / true / false).
        self.linears = choose_linears(model, packed_linears)
        layer = cache.k[0]
        cfg = model.config
        heads = cfg.num_attention_heads
        self.decode = choose_decode_kernel(
            paged_kernel,
            device,
            layer.dtype,
            heads,
            layer.shape[1],
            layer.shape[-1],
            cache.block_size,
        )
        self.kernel = self.decode.use

    def _paged(
        self, batch: StepBatch
    ) -> tuple[PagedBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
        dev = self.device
        bs = self.cache.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        dec_idx: list[int] = []
        dec_blocks: list[list[int]] = []
        dec_lens: list[int] = []
        prefills: list[PrefillRow] = []
        held_at: list[int] = []  # packed index of each row whose input is on the device
        held_rows: list[int] = []
        for i, row in enumerate(batch.rows):
            start = len(ids)
            if row.token_ids[0] == HELD:
                held_at.append(start)
                held_rows.append(i)
            ids.extend(row.token_ids)
            pos.extend(range(row.start_pos, row.start_pos + len(row.token_ids)))
            slots.extend(row.slots)
            last.append(len(ids) - 1)
            if row.is_decode:
                dec_idx.append(start)
                dec_blocks.append(row.block_table[: -(-row.ctx_len // bs)])
                dec_lens.append(row.ctx_len)
            else:
                ctx = None
                if row.start_pos > 0:  # a prefill over cached context: read it through blocks
                    table = torch.tensor(row.block_table[: -(-row.ctx_len // bs)])
                    ctx = (table[:, None] * bs + torch.arange(bs)).view(-1)[: row.ctx_len]
                    ctx = ctx.to(dev)
                prefills.append(PrefillRow(start, len(row.token_ids), ctx))
        width = max((len(b) for b in dec_blocks), default=0)
        blocks = torch.zeros(len(dec_blocks), width, dtype=torch.long)
        for i, b in enumerate(dec_blocks):
            blocks[i, : len(b)] = torch.tensor(b, dtype=torch.long)
        lens = torch.tensor(dec_lens, dtype=torch.long).view(-1, 1, 1, 1)
        mask = None if self.kernel else (torch.arange(width * bs).view(1, 1, 1, -1) < lens).to(dev)
        paged = PagedBatch(
            cache=self.cache,
            slot_mapping=torch.tensor(slots, device=dev),
            decode_q_idx=torch.tensor(dec_idx, dtype=torch.long, device=dev),
            decode_blocks=blocks.to(dev),
            decode_lens=lens.to(dev),
            decode_mask=mask,
            prefills=prefills,
            decode_kernel=self.kernel,
        )
        if batch.device_inputs is not None and len(held_at) == len(ids):
            input_ids = batch.device_inputs.reshape(1, -1).to(torch.long)
        else:
            input_ids = torch.tensor([ids], device=dev)
            if held_at:  # some rows' inputs on the device (beside a prefill chunk's tokens)
                src = batch.device_inputs.reshape(-1).to(torch.long)
                at = torch.tensor(held_at, device=dev)
                input_ids[0, at] = src[torch.tensor(held_rows, device=dev)]
        position_ids = torch.tensor([pos], device=dev)
        keep = torch.tensor(last, device=dev)
        return paged, input_ids, position_ids, keep

    def describe(self) -> dict[str, str]:
        """The executor, and the kernels this machine got: what ran, how it was decided
        (measured, set, unavailable) and on what timings."""
        return {
            "executor": "model",
            "linears": self.linears.said("packed", "stock"),
            "decode_attention": self.decode.said("paged_kernel", "gather_sdpa"),
            # A GPU runs its queue while the engine's host work goes on (deferred output
            # lets it); a CPU's forward runs on the host's own cores.
            "overlap": "host and device" if self.device.type == "cuda" else "none",
        }

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> ExecResult:
        t_prep = time.perf_counter()
        paged, input_ids, position_ids, keep = self._paged(batch)
        t0 = time.perf_counter()
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
        return ExecResult(
            tokens=tokens,
            forward_s=t1 - t0,
            sample_s=time.perf_counter() - t1,
            prepare_s=t0 - t_prep,
        )
