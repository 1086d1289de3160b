"""Worst-case reservation: at admission, book every block the request could ever need, by one
of the rules engines before paging used (the vLLM paper's three Orca baselines). Never
preempts; holds memory that short answers never use.

- `oracle`: the request's true length, prompt + max_tokens (when max_tokens is the output
  length, as in a trace replay, the reservation no real system could know in advance);
- `pow2`: the next power of two at or above that length (a request of 25 tokens books 32);
- `max`: the longest request the model takes, `max_len` or, unset, its context length
  (`model.max_model_len`, or the model's own).

A reservation is never less than the request's own length.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import Allocator, PolicyConfig, Sequence, hookimpl

RESERVES = ("oracle", "pow2", "max")


@dataclass
class WorstCaseConfig(PolicyConfig):
    reserve: str = "oracle"  # oracle | pow2 | max
    max_len: int | None = None  # reserve=max: tokens booked (null: the model's context)


class WorstCaseAllocator(Allocator):
    """Reserves a request's worst case at admission, by `reserve`; never preempts."""

    def __init__(self, cfg: WorstCaseConfig) -> None:
        super().__init__(cfg)
        if cfg.reserve not in RESERVES:
            raise ValueError(
                f"allocator.reserve must be one of {', '.join(RESERVES)}; got {cfg.reserve!r}"
            )
        m = cfg.max_len
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(
                f"allocator.max_len must be a positive integer (or null: the model's "
                f"context); got {m!r}"
            )
        self.reserve: str = cfg.reserve
        self.max_len: int | None = m

    def reservation(self, seq: Sequence) -> int:
        """The tokens booked for `seq` at admission."""
        length = seq.max_len
        if self.reserve == "pow2":
            return 1 << (length - 1).bit_length()
        if self.reserve == "max":
            return max(length, self.max_len or self.max_model_len or length)
        return length

    def blocks_to_admit(self, seq: Sequence, block_size: int) -> int:
        return -(-self.reservation(seq) // block_size)

    def blocks_to_grow(self, seq: Sequence, block_size: int, lookahead: int) -> int:
        need = -(-(seq.num_tokens + lookahead) // block_size)
        return max(0, need - len(seq.block_table))


@hookimpl
def register_allocators(register) -> None:  # type: ignore[no-untyped-def]
    register("worst_case", WorstCaseAllocator, WorstCaseConfig)
