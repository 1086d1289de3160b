"""What one step costs depends on, read from the `StepBatch` alone (no model, no tensors).

The real executor packs every row's query tokens into one sequence (no padding between rows);
on CPU in fp32 its Linear layers then run on that many rows rounded up to a bucket
(`packed_linear.rows_bucket`), so `linear_tokens` is the padded count. Attention is split the
way the kernels split it: each prefill row attends its queries over its context (a prompt's
square, Vidur's "equivalent prefill"; a recompute or a cached prefix reads more context than
it has queries), each decode row reads its whole context once.

Under a sliding attention window of W keys (`of(batch, window=W)`, Mistral 7B), a query at
position p attends its last min(p + 1, W) keys: a decode row reads min(context, W) of KV, and a
prefill row's product is its queries x context scaled by the share of the causal mask that
the band keeps, so that the causal-half pricing of a prompt inside the window is unchanged.
What the engine keeps is not: it stores every token's KV whatever the window.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from framework.engine.batch import StepBatch
from framework.engine.view_factory import make_frozen
from framework.executors.packed_linear import rows_bucket

NAMES = (
    "rows",
    "num_tokens",
    "linear_tokens",
    "prefill_rows",
    "prefill_tokens",
    "prefill_attn",
    "decode_rows",
    "decode_ctx",
    "random_rows",
    "decode_max_ctx",
)


@dataclass(frozen=True)
class StepFeatures:
    rows: int  # rows in the forward, each samples one token
    num_tokens: int  # query tokens of all rows, packed
    linear_tokens: int  # num_tokens as the packed Linear layers pad it (CPU fp32)
    prefill_rows: int
    prefill_tokens: int  # query tokens of the prefill rows
    prefill_attn: int  # sum over prefill rows of queries x context (a prompt: its length squared)
    decode_rows: int
    decode_ctx: int  # sum of the decode rows' context lengths (the KV they read)
    random_rows: int  # rows that sample (temperature > 0) instead of an argmax
    # The longest decode context. The portable decode path (gather + SDPA: bf16, fp16, CUDA)
    # pads every decode row to it, so its cost goes with decode_rows x this, not decode_ctx;
    # measured on SmolLM2 bf16, the sum alone under-predicted the Azure slices by 10-15%.
    # Default 0 (features made by hand): profiles then fall back to the mean context.
    decode_max_ctx: int = 0

    @classmethod
    def prompt(cls, tokens: int, linear_tokens: int | None = None) -> StepFeatures:
        """One fresh prompt of `tokens` tokens prefilled whole, as one row (a recompute's
        price); `linear_tokens`: the Linear layers' rows (None: as the packed CPU path pads
        them)."""
        return make_frozen(
            cls,
            rows=1,
            num_tokens=tokens,
            linear_tokens=rows_bucket(tokens) if linear_tokens is None else linear_tokens,
            prefill_rows=1,
            prefill_tokens=tokens,
            prefill_attn=tokens * tokens,
            decode_rows=0,
            decode_ctx=0,
            random_rows=0,
            decode_max_ctx=0,
        )

    @classmethod
    def of(cls, batch: StepBatch, window: int | None = None) -> StepFeatures:
        """The step's features; `window`: the keys a query attends at most (a sliding
        window), which bounds what each row's attention reads (module docstring)."""
        prefill_rows = prefill_tokens = prefill_attn = decode_rows = decode_ctx = random = 0
        longest = 0
        for row in batch.rows:
            q = len(row.token_ids)
            ctx = row.ctx_len
            if window is not None and ctx > window:
                q_ctx = windowed_product(q, ctx, window)
                ctx = window
            else:
                q_ctx = q * ctx
            if q == 1 and row.start_pos > 0:  # `row.is_decode`, inlined (every row, every step)
                decode_rows += 1
                decode_ctx += ctx
                if ctx > longest:
                    longest = ctx
            else:
                prefill_rows += 1
                prefill_tokens += q
                prefill_attn += q_ctx
            if row.samples and not row.padding and not row.sampling.greedy:
                random += 1
        tokens = prefill_tokens + decode_rows
        return make_frozen(  # every step: without the frozen __init__'s per-field setattr
            cls,
            rows=len(batch.rows),
            num_tokens=tokens,
            linear_tokens=rows_bucket(tokens),
            prefill_rows=prefill_rows,
            prefill_tokens=prefill_tokens,
            prefill_attn=prefill_attn,
            decode_rows=decode_rows,
            decode_ctx=decode_ctx,
            random_rows=random,
            decode_max_ctx=longest,
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def band_pairs(q: int, ctx: int, window: int) -> int:
    """(query, key) pairs a banded causal mask keeps for `q` queries ending at position
    `ctx` - 1: each query at position p attends min(p + 1, window) keys."""
    first = ctx - q + 1  # the first query's keys, unwindowed
    if ctx <= window:
        return q * ctx - q * (q - 1) // 2  # the causal triangle's rows, untouched
    if first > window:
        return q * window
    full = (first + window) * (window - first + 1) // 2  # the queries still inside the window
    return full + (ctx - window) * window


def windowed_product(q: int, ctx: int, window: int) -> int:
    """A prefill row's queries x context under a sliding window: q x ctx scaled by the share
    of the causal mask's pairs the band keeps (1 for a row inside the window)."""
    causal = q * ctx - q * (q - 1) // 2
    return q * ctx * band_pairs(q, ctx, window) // causal
