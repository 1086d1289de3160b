"""The model runner for Hugging Face causal LMs: a StepBatch in, sampled token ids (a device
tensor) out. It implements the engine's `Executor` protocol (`framework.engine.executor`).
"""

from __future__ import annotations

import time
import weakref
from array import array
from typing import Any

import torch
from transformers import PreTrainedModel

from framework.engine.batch import HELD, StepBatch
from framework.engine.executor import ExecResult
from framework.engine.kv_cache import KVCache
from framework.engine.scores import layout
from framework.executors.cache_lease import Lease
from framework.executors.decode_graphs import DecodeGraphs, Forward, StaticInputs, buckets
from framework.executors.device_time import DeviceSpan
from framework.executors.flex_paged import FlexDecode, decode_plan, prefill_plan
from framework.executors.host_kv import HostKV
from framework.executors.kernel_choice import (
    AUTO,
    Choice,
    choose_argmax,
    choose_decode_kernel,
    choose_flex,
    choose_glue,
)
from framework.executors.kernels.argmax import kernel_argmax
from framework.executors.linear_choice import choose_linears, choose_small_linears
from framework.executors.logprobs import keep_scored, score
from framework.executors.paged_attention import ATTN_NAME, PagedBatch, PrefillRow
from framework.executors.penalties import TokenCounts
from framework.executors.sampler import sample

# Where a step's logits are read when some row scores prompt positions: each row's last
# query among the kept ones (None: every kept logit is a row's, as in a bucket's step), and
# the scored prompt positions, in order.
Picks = tuple[torch.Tensor | None, torch.Tensor]


class HFExecutor:
    """Runs a Hugging Face causal LM over one packed sequence with paged attention."""

    scores = True  # computes the log-probabilities rows ask for (`framework.engine.scores`)

    def __init__(
        self,
        model: PreTrainedModel,
        cache: KVCache,
        device: torch.device,
        packed_linears: Any = AUTO,
        small_linear: Any = AUTO,
        paged_kernel: Any = AUTO,
        argmax_kernel: Any = AUTO,
        layer_glue: Any = AUTO,
        flex_decode: Any = AUTO,
        flex_prefill: Any = AUTO,
        graphs: Choice | None = None,
        lease: Lease | None = None,
        max_num_seqs: int = 16,
        max_len: int = 2048,
        host_blocks: int = 0,
    ) -> None:
        """`graphs`: whether decode steps run through static buffers (`decode_graphs.py`,
        captured on CUDA; `choose_graphs`), over `lease`'s cache when one is lent
        (`cache_lease.py`): buckets up to `max_num_seqs` rows, tables as wide as `max_len`.
        `host_blocks`: the host KV tier's blocks (`host_kv.py`), where a swap copies to."""
        self.model = model
        self.cache = cache
        self.device = device
        self.host = HostKV(cache, host_blocks) if host_blocks else None
        # Measured forward seconds per prefill token, for a preemption's predicted cost of
        # recomputing: over the steps with prefill rows so far.
        self._prefill_s = 0.0
        self._prefill_tokens = 0
        model.set_attn_implementation(ATTN_NAME)
        # The model object may be shared (tests, benchmarks): each engine states its own way,
        # measured on this machine unless set (auto / true / false).
        self.linears = choose_linears(model, packed_linears)
        self.small = choose_small_linears(model, small_linear, packed_linears)
        self.glue = choose_glue(model, layer_glue, device)
        bs = cache.block_size
        self.flex_dec = choose_flex(flex_decode, "flex_decode", device, bs)
        self.flex_pre = choose_flex(flex_prefill, "flex_prefill", device, bs)
        layer = cache.k[0]
        cfg = model.config
        heads = cfg.num_attention_heads
        if self.flex_dec.use:  # flex_attention serves the decode rows: no kernel timed or run
            self.decode = Choice(False, "set", "flex_decode")
        else:
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
        self.greedy = choose_argmax(argmax_kernel, device, cfg.vocab_size)
        self._argmax = kernel_argmax if self.greedy.use else None
        self.counts = TokenCounts(cfg.vocab_size, device)  # penalized sequences' tokens
        self.graphed = graphs or Choice(False, "set", "")
        self.graphs: DecodeGraphs | None = None
        self.graph_steps = 0  # decode steps this executor ran through the static buffers
        if self.graphed.use:
            try:
                self.graphs = self._graphs(lease, max_num_seqs, max_len)
            except RuntimeError as err:  # a kernel that cannot be captured: `auto` runs eager
                if self.graphed.how == "set":
                    raise
                why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                self.graphed = Choice(False, "unavailable", f"capture failed: {why}")

    @torch.inference_mode()
    def _graphs(self, lease: Lease | None, max_num_seqs: int, max_len: int) -> DecodeGraphs:
        """The decode buckets over this cache: the lease's, if captured there before for the
        same table width and kernels up to at least `max_num_seqs` rows (a calibration's
        points differ in `max_num_seqs`: a smaller one pads into the larger's buckets); else
        made (and captured, on CUDA) now, in place of a smaller set."""
        cache = self.cache
        bs = cache.block_size
        width = min(-(-max_len // bs), cache.num_blocks)
        key = (width, self.kernel, self.flex_dec.use, self.glue.use)
        if lease is not None:
            lease.holder = weakref.ref(self)
            known = lease.graphs.get(key)
            if known is not None and known.sizes[-1] >= max_num_seqs:
                return known
        sizes = buckets(max_num_seqs)
        kernel, flex = self.kernel, self.flex_dec.use
        forward = decode_forward(weakref.ref(self.model), cache, kernel, flex)
        graphs = DecodeGraphs(forward, sizes, width, bs, cache.scratch_block, self.device)
        if lease is not None:
            lease.graphs[key] = graphs
        return graphs

    def _paged(
        self, batch: StepBatch, scores_prompt: bool = False
    ) -> tuple[PagedBatch, torch.Tensor, torch.Tensor, torch.Tensor, Picks | None]:
        """The step's tensors from its rows. Host work before every forward, so built with
        one pass over the rows and one conversion per tensor (`_longs`): on a GPU a small
        model's decode step takes a few milliseconds, and a tensor a row (the block tables)
        costs milliseconds of its own at a hundred rows. `scores_prompt`: some row scores
        prompt positions, whose logits are kept too (`Picks`)."""
        dev = self.device
        bs = self.cache.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        dec_idx: list[int] = []
        dec_tables: list[list[int]] = []
        dec_lens: list[int] = []
        prefills: list[PrefillRow] = []
        held_at: list[int] = []  # packed index of each row whose input is on the device
        held_rows: list[int] = []
        # each prefill row's (packed start, queries, first position, blocks) for flex_attention
        flex_rows: list[tuple[int, int, int, list[int]]] | None = [] if self.flex_pre.use else None
        for i, row in enumerate(batch.rows):
            start = len(ids)
            tokens = row.token_ids
            q = len(tokens)
            first = row.start_pos
            if tokens[0] == HELD:
                held_at.append(start)
                held_rows.append(i)
            ids += tokens
            slots += row.slots
            last.append(start + q - 1)
            if q == 1 and first > 0:  # `row.is_decode`, inlined (every row, every step)
                pos.append(first)
                dec_idx.append(start)
                dec_tables.append(row.block_table[: -(-row.ctx_len // bs)])
                dec_lens.append(row.ctx_len)
                continue
            pos += range(first, first + q)
            ctx = None
            if flex_rows is not None:  # flex_attention reads every prefill row through blocks
                flex_rows.append((start, q, first, row.block_table[: -(-row.ctx_len // bs)]))
            elif first > 0:  # a prefill over cached context: read it through blocks
                table = torch.tensor(row.block_table[: -(-row.ctx_len // bs)])
                ctx = _send((table[:, None] * bs + torch.arange(bs)).view(-1)[: row.ctx_len], dev)
            prefills.append(PrefillRow(start, q, ctx))
        width = max(map(len, dec_tables), default=0)
        padded: list[int] = []  # each decode row's table, padded with block 0 to `width`
        pad = [0] * width
        for blocks_of in dec_tables:
            padded += blocks_of
            padded += pad[: width - len(blocks_of)]
        blocks = _send(_longs(padded).view(len(dec_tables), width), dev)
        lens = _send(_longs(dec_lens).view(-1, 1, 1, 1), dev)
        cols = self.cache.num_blocks + 1  # the pool's blocks, scratch included
        mask = flex_dec = flex_pre = None
        if dec_idx:
            mask, flex_dec = decode_reads(blocks, lens, bs, cols, self.kernel, self.flex_dec.use)
        if flex_rows:

            def send(values: list[int]) -> torch.Tensor:
                return _send(_longs(values), dev)

            flex_pre = prefill_plan(flex_rows, bool(dec_idx), bs, cols, send)
        paged = PagedBatch(
            cache=self.cache,
            slot_mapping=_send(_longs(slots), dev),
            decode_q_idx=_send(_longs(dec_idx), dev),
            decode_blocks=blocks,
            decode_lens=lens,
            decode_mask=mask,
            prefills=prefills,
            decode_kernel=self.kernel,
            flex_decode=flex_dec,
            flex_prefill=flex_pre,
        )
        if batch.device_inputs is not None and len(held_at) == len(ids):
            input_ids = batch.device_inputs.reshape(1, -1).to(torch.long)
        else:
            input_ids = _send(_longs(ids).view(1, -1), dev)
            if held_at:  # some rows' inputs on the device (beside a prefill chunk's tokens)
                src = batch.device_inputs.reshape(-1).to(torch.long)
                at = _send(_longs(held_at), dev)
                input_ids[0, at] = src[_send(_longs(held_rows), dev)]
        position_ids = _send(_longs(pos).view(1, -1), dev)
        picks = None
        if scores_prompt:
            kept, pick, scored = keep_scored(batch.rows, last)
            last = kept
            picks = (_send(_longs(pick), dev), _send(_longs(scored), dev))
        keep = _send(_longs(last), dev)
        return paged, input_ids, position_ids, keep, picks

    def describe(self) -> dict[str, str]:
        """The executor, and the kernels this machine got: what ran, how it was decided
        (measured, set, default, unavailable) and on what timings."""
        flex = self.flex_dec
        return {
            "executor": "model",
            "linears": self.linears.said("packed", "stock"),
            "small_linear": self.small.said("kernel", "off"),
            "decode_attention": flex.said("flex_attention", "")
            if flex.use
            else self.decode.said("paged_kernel", "gather_sdpa"),
            "flex_decode": flex.said("on", "off"),  # why flex_attention serves, or why not
            "prefill_attention": self.flex_pre.said("flex_attention", "sdpa_per_row"),
            "argmax": self.greedy.said("kernel", "torch"),
            "layer_glue": self.glue.said("fused", "eager"),
            "cuda_graphs": self.graphed.said("on", "off"),
            # decode steps served from a bucket (the others had a prefill row, or more rows)
            "bucket_steps": str(self.graph_steps),
            # A GPU runs its queue while the engine's host work goes on (deferred output
            # lets it); a CPU's forward runs on the host's own cores.
            "overlap": "host and device" if self.device.type == "cuda" else "none",
        }

    def swap_seconds(self, blocks: int) -> float:
        """Predicted seconds to copy `blocks` blocks one way: as the copies so far took."""
        return blocks * self.host.seconds_per_block() if self.host is not None else 0.0

    def prefill_seconds(self, tokens: int) -> float:
        """Predicted seconds to prefill `tokens` again: as this run's prefills took."""
        if not self._prefill_tokens:
            return 0.0
        return tokens * self._prefill_s / self._prefill_tokens

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> ExecResult:
        swap_s = 0.0
        if batch.swaps:
            if self.host is None:
                raise RuntimeError("a step asks for KV swaps of an executor with no host tier")
            swap_s = self.host.copy(self.cache, batch.swaps)
        if batch.copies:  # after the copies out: a block copied to may be one swapped out
            t_copy = time.perf_counter()
            self.cache.copy_blocks(batch.copies)
            swap_s += time.perf_counter() - t_copy
        t_prep = time.perf_counter()
        rows = len(batch.rows)
        decode = rows if batch.decode_rows == rows else 0  # its device seconds fit row_s
        graphs = self.graphs
        plan = layout(batch.rows)  # the log-probabilities asked for: None, mostly
        picks: Picks | None = None
        if graphs is not None and graphs.fits(batch):  # decode rows alone: a bucket serves
            bucket, n = graphs.stage(batch)
            t0 = time.perf_counter()
            span = DeviceSpan.begin(self.device, decode)  # CUDA: the device's seconds
            logits = graphs.launch(bucket, n)
            self.graph_steps += 1
            if plan is not None and plan.prompt:  # one-query prompt chunks: a row each
                picks = (None, _send(_longs([i for i, _, _ in plan.prompt]), self.device))
        else:
            prompt = plan is not None and bool(plan.prompt)
            paged, input_ids, position_ids, keep, picks = self._paged(batch, prompt)
            t0 = time.perf_counter()
            span = DeviceSpan.begin(self.device, decode)
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                logits_to_keep=keep,
                use_cache=False,
                paged=paged,
            )
            logits = out.logits[0]
        t1 = time.perf_counter()
        if span is not None:  # the forward's device time ends, the sampler's begins
            span.mark()
        prompt_logits = None
        if picks is not None:  # the prompt positions scored, and the rows' last logits
            pick, scored = picks
            prompt_logits = logits.index_select(0, scored)
            logits = logits if pick is None else logits.index_select(0, pick)
        if batch.ended:
            self.counts.end(batch.ended)
        drawn, counting = (logits.float(), None)
        if batch.shaped:  # penalties, min_tokens: a copy, the model's logits left to score
            drawn, counting = self.counts.shape(drawn, batch)
        tokens = sample(drawn, batch.rows, self._argmax)
        self.counts.count(tokens, counting)
        scores = None
        if plan is not None:
            scores = score(batch.rows, plan, logits, tokens, prompt_logits)
        if span is not None:
            span.mark()
        if batch.prefill_tokens:
            self._prefill_s += t1 - t0
            self._prefill_tokens += batch.num_tokens
        return ExecResult(
            tokens=tokens,
            forward_s=t1 - t0,
            sample_s=time.perf_counter() - t1,
            prepare_s=t0 - t_prep,
            span=span,
            swap_s=swap_s,
            scores=scores,
        )


def decode_reads(
    blocks: torch.Tensor, lens: torch.Tensor, block_size: int, cols: int, kernel: bool, flex: bool
) -> tuple[torch.Tensor | None, FlexDecode | None]:
    """What the decode rows' attention reads beside their tables and lengths, made on the
    device from them (no wait): flex_attention's plan, or the gather path's mask; neither
    for the C++ kernel, which reads the lengths."""
    if flex:
        return None, decode_plan(blocks, lens, block_size, cols)
    if kernel:
        return None, None
    slots = torch.arange(blocks.shape[1] * block_size, device=lens.device)
    return slots.view(1, 1, 1, -1) < lens, None


def decode_forward(
    model: weakref.ref[PreTrainedModel], cache: KVCache, kernel: bool, flex: bool
) -> Forward:
    """A decode step's model call on a bucket's static buffers, as `_paged` and `execute`
    make it for a step of decode rows: what is derived from the inputs (the gather path's
    mask, flex_attention's plan) is made inside it, so a captured graph recomputes it on
    replay. It holds the model weakly: the process's lease outlives an engine, not a model."""
    bs = cache.block_size
    cols = cache.num_blocks + 1  # the pool's blocks, scratch included

    def forward(static: StaticInputs) -> torch.Tensor:
        m = model()
        assert m is not None, "the model of these decode graphs is gone"
        lens, tables = static.lens, static.tables
        mask, plan = decode_reads(tables, lens, bs, cols, kernel, flex)
        paged = PagedBatch(
            cache=cache,
            slot_mapping=static.slots,
            decode_q_idx=torch.arange(static.size, device=lens.device),
            decode_blocks=tables,
            decode_lens=lens,
            decode_mask=mask,
            prefills=[],
            decode_kernel=kernel,
            flex_decode=plan,
        )
        out = m(
            input_ids=static.ids,
            position_ids=static.positions,
            logits_to_keep=0,  # every row's: each is a decode row
            use_cache=False,
            paged=paged,
        )
        return out.logits[0]

    return forward


def _send(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor of the step's inputs on `device` without making the host wait: on a GPU
    copied from pinned memory asynchronously, queued behind the previous step's forward
    (PyTorch's caching host allocator keeps a pinned block until the copy that reads it is
    done, so no later step can overwrite it in flight); on a CPU it is already there."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _longs(values: list[int]) -> torch.Tensor:
    """A host int64 tensor of `values`: through `array` (a C loop over the ints), 3x faster
    than `torch.tensor` on a list of thousands, as a step's block tables are. The tensor
    keeps the array alive; only this step's preparation writes into it (held inputs)."""
    if not len(values):
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(array("q", values), dtype=torch.long)
