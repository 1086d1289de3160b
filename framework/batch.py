"""One engine step's batch as the executor receives it: plain host lists (and, at most, the
previous step's sampled tensor as the next inputs).

Kept free of torch so that another executor (a calibrated simulator, say) can consume the
same batch without a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from framework.request import SamplingParams


@dataclass
class Row:
    seq_id: str
    token_ids: list[int]  # this step's query tokens: a whole prompt (prefill) or one (decode)
    start_pos: int  # position of token_ids[0] in the sequence
    slots: list[int]  # cache slot written for each query token
    ctx_slots: (
        list[int] | None
    )  # every slot the row attends to, in position order; None: its own only
    sampling: SamplingParams
    token_index: int  # which output token this row samples (seeds its draw)
    discard: bool = False  # computed, but nobody keeps its token (a finished row in a static batch)

    @property
    def is_decode(self) -> bool:
        return len(self.token_ids) == 1 and self.ctx_slots is not None


@dataclass
class StepBatch:
    rows: list[Row]
    # When set (a device tensor, one id per row), every row is a decode row whose input token
    # is still on the device from the previous step; `Row.token_ids` then holds a placeholder.
    device_inputs: Any = None

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    @property
    def prefill_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows if not r.is_decode)

    @property
    def decode_rows(self) -> int:
        return sum(1 for r in self.rows if r.is_decode)
