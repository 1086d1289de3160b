"""Log-probabilities that come home with the sampled tokens (`SamplingParams.logprobs` and
`prompt_logprobs`).

An executor that computes them returns one `Scores` a step: for every scored position, the
log-probability of its token and of the k most likely tokens, from the model's logits
before temperature and filtering (what Hugging Face's `log_softmax` of the same logits
gives, and vLLM's default `raw_logprobs`). They are made on the device from the logits
the sampler reads, with no extra forward and no wait, and travel home with the step's
tokens. Which position is whose is the step's `layout`, made from the batch's rows on the
host: the executor and the engine read the same rows, so no index crosses the device.

The order of a step's scored positions: every prompt position, row by row, then every
sampled token, row by row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from framework.core.token_logprob import TokenLogprob

if TYPE_CHECKING:
    from framework.core.sequence import Sequence
    from framework.engine.batch import Row


@dataclass
class Layout:
    """Which positions of a step are scored, from its rows alone (see the module's note)."""

    prompt: list[tuple[int, int, int]] = field(default_factory=list)  # (row, 1st position, n)
    sampled: list[tuple[int, int]] = field(default_factory=list)  # (row, output token index)
    top: int = 0  # the most alternatives any scored position asks for

    @property
    def positions(self) -> int:
        return sum(n for _, _, n in self.prompt) + len(self.sampled)


def layout(rows: list[Row]) -> Layout | None:
    """The step's scored positions, or None when no row asks (every step of most runs: one
    pass over two fields a row)."""
    for row in rows:
        if row.sampling.scored or row.prompt_targets:
            break
    else:
        return None
    out = Layout()
    for i, row in enumerate(rows):
        sp = row.sampling
        if row.prompt_targets:
            out.prompt.append((i, row.start_pos + 1, len(row.prompt_targets)))
            out.top = max(out.top, sp.prompt_logprobs or 0)
        top = sp.scored_top
        if top is not None and row.samples and not row.padding:
            out.sampled.append((i, row.token_index))
            out.top = max(out.top, top)
    return out if out.prompt or out.sampled else None


@dataclass
class Scores:
    """One step's scored positions: `logprob` [P], `top_ids` and `top_logprobs` [P, top],
    device tensors until the step's readback makes them host lists (`home`)."""

    layout: Layout
    logprob: Any
    top_ids: Any
    top_logprobs: Any

    def home(self) -> None:
        """Host lists in place of the tensors (after the step's tokens were fetched, which
        waited for the device: these come from the same queue, before them)."""
        for name in ("logprob", "top_ids", "top_logprobs"):
            value = getattr(self, name)
            if not isinstance(value, list):
                setattr(self, name, value.tolist())

    def deliver(self, rows: list[Sequence]) -> None:
        """Each scored position's entry to its request: a prompt position's by its place
        in the prompt (scored again after a recompute: the same entry), a sampled token's
        by its index among the outputs, only where that token reached the request (not an
        overshoot past its stop)."""
        self.home()
        lp, ids, tops = self.logprob, self.top_ids, self.top_logprobs
        j = 0
        for i, first, n in self.layout.prompt:
            seq = rows[i]
            k = seq.sampling.prompt_logprobs or 0
            book = seq.prompt_logprobs
            if len(book) < seq.prompt_len:
                book.extend([None] * (seq.prompt_len - len(book)))
            for p in range(first, first + n):
                book[p] = TokenLogprob(lp[j], tuple(zip(ids[j][:k], tops[j][:k], strict=True)))
                j += 1
        for i, index in self.layout.sampled:
            seq = rows[i]
            if index < len(seq.output_token_ids):
                k = seq.sampling.scored_top or 0
                book = seq.output_logprobs
                if len(book) <= index:
                    book.extend([None] * (index + 1 - len(book)))
                book[index] = TokenLogprob(lp[j], tuple(zip(ids[j][:k], tops[j][:k], strict=True)))
            j += 1
