"""The batch build: a step's plan packed into one `StepBatch`, reading the plan alone.

Each of the plan's rows gets its query tokens (a prompt chunk, one decode token, or a token
still on the device), the cache slots it writes and the context it reads. Its counts are
taken while packing, so nobody passes over the rows again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from framework.core.sequence import Sequence
from framework.engine.batch import HELD, Row, StepBatch
from framework.engine.held import HeldStep
from framework.engine.invariants import InvariantError
from framework.engine.sequence_state import SequenceStates
from framework.engine.step_plan import StepPlan


def slots(table: list[int], start: int, end: int, bs: int) -> list[int]:
    """The cache slots of positions start..end-1: one contiguous range per block, so a
    thousand-token prompt costs a few list extensions, not a thousand lookups."""
    if end - start == 1:
        return [table[start // bs] * bs + start % bs]
    if end - start > 4 * bs:  # a long prompt: one numpy outer sum, not a loop per block
        first, last = start // bs, (end - 1) // bs + 1
        if last > len(table):
            raise IndexError(f"block {last - 1} of a {len(table)}-block table")
        grid = np.asarray(table[first:last])[:, None] * bs + np.arange(bs)
        off = start - first * bs
        slots: list[int] = grid.ravel()[off : off + end - start].tolist()
        return slots
    out: list[int] = []
    pos = start
    while pos < end:
        base = table[pos // bs] * bs
        stop = min(end, (pos // bs + 1) * bs)
        out.extend(range(base + pos % bs, base + pos % bs + (stop - pos)))
        pos = stop
    return out


class BatchBuilder:
    """Packs the running rows. `map_slots` is False for an executor that reads the rows'
    shapes only (the simulator): a prompt's slots, a list as long as the prompt, are then
    left unmapped, and only the block table's length is checked."""

    def __init__(
        self,
        block_size: int,
        scratch_block: int,
        fail: Callable[[str, str], Exception],
    ) -> None:
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.fail = fail  # a policy's error, naming it (`Planner.fail`)
        self.map_slots = True
        self.states = SequenceStates()  # the sequences the executor keeps counts for

    def short_table(self, seq: Sequence, exc: IndexError) -> Exception:
        """What an IndexError while building `seq`'s row means: the allocator left it too
        few blocks for the positions this step writes (the original error, if not)."""
        if len(seq.block_table) * self.block_size >= seq.total_len:
            return exc
        n, total, held = len(seq.block_table), seq.total_len, seq.num_held
        msg = f"left {seq.id} {n} blocks for {total} cached tokens ({held} held on the device)"
        return self.fail("allocator", msg)

    def build(self, plan: StepPlan, newest: HeldStep | None, waiting: int = 0) -> StepBatch:
        """The plan's rows, packed, each computing `plan.tokens(seq)`. While the rows are
        exactly those of the newest held step, every row with a held token takes it from
        that step's device tensor: nothing crosses to the host (a row part way through a
        chunked prefill sends its next prompt tokens)."""
        bs = self.block_size
        running = plan.rows
        partial = plan.partial
        from_device = newest is not None and newest.rows == running
        map_slots = self.map_slots
        rows: list[Row] = []
        num_tokens = prefill_tokens = decode_rows = sampling_rows = 0
        shaped = False
        try:
            for i, seq in enumerate(running):
                # `total_len` and `id` inlined: this loop runs for every row of every step,
                # and at trace scale it is the largest share of the engine's host work.
                spec = seq.spec
                sampling = spec.sampling
                out = seq.output_token_ids
                index = len(out) + seq.num_held
                total_len = seq.prompt_len + index
                if seq.finished:
                    # Still in a static batch: computed like a decode row over its cached
                    # context, kept by nobody. Its K/V goes to the scratch block: no live
                    # block is touched.
                    token = HELD if from_device else seq.tokens_from(seq.num_tokens - 1)[0]
                    scratch = [self.scratch_block * bs + i % bs]
                    rows.append(
                        Row(
                            seq.id,
                            [token],
                            seq.num_computed,
                            scratch,
                            seq.block_table,
                            seq.num_computed,
                            seq.sampling,
                            index,
                            padding=True,
                            prefill=False,
                        )
                    )
                    num_tokens += 1
                    decode_rows += 1
                    sampling_rows += 1
                    continue
                start = seq.num_computed
                table = seq.block_table
                targets = None
                if seq.num_held:
                    if not from_device:
                        raise InvariantError(f"{seq.id}'s input token is held but its rows changed")
                    tokens = [HELD]
                    row_slots = [table[start // bs] * bs + start % bs]
                elif start == total_len - 1:
                    # A decode row (most rows of most steps): its one input token is the last
                    # applied one; no slicing, no slot loop.
                    tokens = [out[-1]] if out else [spec.prompt_token_ids[-1]]
                    row_slots = [table[start // bs] * bs + start % bs]
                else:
                    n = partial.get(seq)  # None: all it has pending
                    if n is None:
                        tokens = seq.tokens_from(start)
                    else:
                        tokens = seq.tokens_between(start, start + n)
                    end = start + len(tokens)
                    if sampling.prompt_logprobs is not None and start < seq.prompt_len - 1:
                        # scored again on a recompute: the same entries (`engine.scores`)
                        targets = spec.prompt_token_ids[start + 1 : min(end + 1, seq.prompt_len)]
                    if map_slots:
                        row_slots = slots(table, start, end, bs)
                    elif (end - 1) // bs >= len(table):  # the check `slots` makes, alone
                        raise IndexError(f"block {(end - 1) // bs} of a {len(table)}-block table")
                    else:
                        row_slots = []  # an executor that reads shapes only: nothing to map
                q = len(tokens)
                end = start + q
                samples = end == total_len
                prefill = start < seq.prefill_end
                row = Row(
                    spec.id, tokens, start, row_slots, table, end, sampling, index, False,
                    samples, prefill, targets,
                )  # fmt: skip
                if sampling.shaped:
                    shaped = True
                    if index < sampling.min_tokens:
                        row.banned = tuple(seq.stop_ids)
                    if sampling.penalized:
                        row.history = self.states.history(seq)
                rows.append(row)
                num_tokens += q
                if prefill:
                    prefill_tokens += q
                else:
                    decode_rows += 1
                sampling_rows += samples
        except IndexError as exc:  # a block table too short for a position this step writes
            raise self.short_table(running[len(rows)], exc) from exc
        device_inputs = newest.pending.tokens if from_device and newest is not None else None
        return StepBatch.counted(
            rows,
            device_inputs,
            num_tokens=num_tokens,
            prefill_tokens=prefill_tokens,
            decode_rows=decode_rows,
            sampling_rows=sampling_rows,
            waiting=waiting,
            swaps=plan.swaps,
            copies=plan.copies,
            ended=self.states.ended() if self.states else (),
            shaped=shaped,
        )
