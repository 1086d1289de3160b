"""One engine step's batch as the executor receives it: plain host lists (and, at most, the
previous step's sampled tensor as the next inputs).

Kept free of model code so that another executor (a calibrated simulator, say) can consume
the same batch from its lengths alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from framework.core.request import SamplingParams

HELD = -1  # placeholder id of a decode row whose input token is still on the device


@dataclass(slots=True)  # built for every row of every step: slots make that cheaper
class Row:
    seq_id: str
    token_ids: list[int]  # this step's query tokens: a whole prompt (prefill) or one (decode)
    start_pos: int  # position of token_ids[0] in the sequence
    # Cache slot written for each query token; a prefill row's is empty when the executor
    # reads shapes only (`reads_slots = False`: the simulator).
    slots: list[int]
    block_table: list[int]  # the row's blocks; positions 0..ctx_len-1 are read through it
    ctx_len: int  # positions the row attends to (its new tokens included, unless padding)
    sampling: SamplingParams
    token_index: int  # which output token this row samples (seeds its draw)
    padding: bool = False  # a finished row a static batch keeps: computed, its token thrown away
    # False for a prefill chunk that stops short of its sequence's end: computed into the
    # cache, nothing sampled (no token, no seeded draw, no stop check).
    samples: bool = True
    # Whether the row computes prefill (prompt, or recomputed) tokens, as the engine counts
    # them; None (rows made by hand): any row that is not a decode by shape.
    prefill: bool | None = None
    # A prompt chunk of a request that asks for prompt log-probabilities: the prompt's next
    # token after each of the row's first len(prompt_targets) queries, scored from their
    # logits (`framework.engine.scores`). None for every other row.
    prompt_targets: list[int] | None = None
    # The tokens this row may not sample: its stop tokens while its output is shorter than
    # `sampling.min_tokens`. Empty for every other row.
    banned: tuple[int, ...] = ()
    # A penalized sequence's tokens so far (prompt, output) on the first row of it the
    # executor computes, where its state starts (`framework.engine.sequence_state`).
    history: tuple[list[int], list[int]] | None = None

    @property
    def is_decode(self) -> bool:
        """One query over a cached context: batched with the other decode rows. The kernel
        path, not the count: a one-token prefill chunk runs as a decode row."""
        return len(self.token_ids) == 1 and self.start_pos > 0

    @property
    def in_prefill(self) -> bool:
        """Counted as prefill: the engine's word, else the row's shape."""
        return (not self.is_decode) if self.prefill is None else self.prefill


@dataclass(frozen=True)
class Swaps:
    """One step's copies between the tiers, as (from, to) block pairs: `out`, device to
    host (copied first), then `into`, host to device; both before the step's forward."""

    out: tuple[tuple[int, int], ...] = ()
    into: tuple[tuple[int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.out or self.into)


NO_SWAPS = Swaps()


@dataclass
class StepBatch:
    rows: list[Row]
    # When set (a device tensor, one id per row), every row is a decode row whose input token
    # is still on the device from the previous step; `Row.token_ids` then holds a placeholder.
    device_inputs: Any = None
    # Requests still waiting once the step was planned: what a real engine's scheduler walks
    # each step, so a simulated engine's software prices it (`executor.software`).
    waiting: int = 0
    # KV blocks the executor copies between the device and the host tier before the
    # forward (`framework.engine.host_tier`): every copy out, then every copy in.
    swaps: Swaps = NO_SWAPS
    # KV blocks copied within the device before the forward, (from, to), after the copies
    # out: the block each sample forked this step writes next (copy on write).
    copies: tuple[tuple[int, int], ...] = ()
    # Sequences that left the engine for good since the last step: the executor drops the
    # state it kept for them (`framework.engine.sequence_state`).
    ended: tuple[str, ...] = ()
    # Whether some row's logits change before its draw (`SamplingParams.shaped`): else the
    # executor looks at no row for it.
    shaped: bool = False

    @classmethod
    def counted(
        cls,
        rows: list[Row],
        device_inputs: Any,
        *,
        num_tokens: int,
        prefill_tokens: int,
        decode_rows: int,
        sampling_rows: int,
        waiting: int = 0,
        swaps: Swaps = NO_SWAPS,
        copies: tuple[tuple[int, int], ...] = (),
        ended: tuple[str, ...] = (),
        shaped: bool = False,
    ) -> StepBatch:
        """A batch whose counts its builder already took while packing it (the engine does:
        at trace scale three more passes over the rows were a tenth of its host work)."""
        batch = cls(rows, device_inputs, waiting, swaps, copies, ended, shaped)
        batch.__dict__.update(  # what the cached properties below would compute
            num_tokens=num_tokens,
            prefill_tokens=prefill_tokens,
            decode_rows=decode_rows,
            sampling_rows=sampling_rows,
        )
        return batch

    # Computed once: a batch's rows do not change after it is built, and the engine, the
    # invariants and the executor each ask.
    @cached_property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    @cached_property
    def prefill_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows if r.in_prefill)

    @cached_property
    def decode_rows(self) -> int:
        """Rows decoding one sampled token (each is one decode token)."""
        return sum(1 for r in self.rows if not r.in_prefill)

    @cached_property
    def sampling_rows(self) -> int:
        """Rows that sample a token (kept or, in a static batch, discarded)."""
        return sum(1 for r in self.rows if r.samples)
