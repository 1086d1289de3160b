"""Logits shaped before the draw, on the device with no host sync: `min_tokens`' masked stop
tokens, and the presence, frequency and repetition penalties of each request, whatever else
shares its batch.

A penalized sequence's tokens are counted in one row of a device table (`TokenCounts`): its
prompt's as a mask, its output's as counts. The row starts from the tokens the batch gives on
the sequence's first row (`Row.history`) and then grows on the device, from each step's
sampled tensor, before any of it is read back: so deferred output (tokens still on the
device) changes nothing, and no value crosses to the host. It is dropped when the batch says
the sequence has ended (`StepBatch.ended`).

The penalties are vLLM's (and OpenAI's): a logit l of a token counted c times in the output
becomes l - frequency * c - presence * (c > 0); before that, for a token in the prompt or the
output, l / repetition if l > 0, else l * repetition (Keskar et al., as Hugging Face's
`repetition_penalty`). Log-probabilities stay the model's own, read from the logits before.
"""

from __future__ import annotations

import torch

from framework.engine.batch import StepBatch
from framework.executors.sampler import to_device


class TokenCounts:
    def __init__(self, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.device = device
        self.slot: dict[str, int] = {}
        self.free: list[int] = []
        self.counts = torch.zeros(0, vocab, dtype=torch.int32, device=device)
        self.prompt = torch.zeros(0, vocab, dtype=torch.bool, device=device)

    def __len__(self) -> int:
        return len(self.slot)

    def _start(self, seq_id: str, prompt: list[int], output: list[int]) -> int:
        """A slot for `seq_id`, its counts those of `prompt` and `output` (a new start)."""
        slot = self.slot.get(seq_id)
        if slot is None:
            if not self.free:  # twice the slots: the new ones free, the lowest taken first
                old = len(self.counts)
                more = max(8, old)
                self.counts = torch.cat([self.counts, self.counts.new_zeros(more, self.vocab)])
                self.prompt = torch.cat([self.prompt, self.prompt.new_zeros(more, self.vocab)])
                self.free = list(range(old + more - 1, old - 1, -1))
            slot = self.slot[seq_id] = self.free.pop()
        self.counts[slot].zero_()
        self.prompt[slot].zero_()
        self.prompt[slot].index_fill_(0, to_device(self.device, prompt, torch.long), True)
        if output:
            ids = to_device(self.device, output, torch.long)
            self.counts[slot].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        return slot

    def end(self, seq_ids: tuple[str, ...]) -> None:
        for seq_id in seq_ids:
            slot = self.slot.pop(seq_id, None)
            if slot is not None:
                self.free.append(slot)

    def shape(self, logits: torch.Tensor, batch: StepBatch) -> tuple[torch.Tensor, Counting]:
        """`logits` ([rows, vocab], fp32) as the draw reads them (a copy where any row
        changes; the model's own left for the log-probabilities), and the sampled rows
        whose tokens `count` then adds."""
        banned = [(i, t) for i, row in enumerate(batch.rows) for t in row.banned]
        at: list[int] = []
        slots: list[int] = []
        for i, row in enumerate(batch.rows):
            if not row.sampling.penalized or row.padding:
                continue
            slot = self._start(row.seq_id, *row.history) if row.history else self.slot[row.seq_id]
            if row.samples:  # a prompt chunk short of its end draws nothing
                at.append(i)
                slots.append(slot)
        if not banned and not at:
            return logits, None
        logits = logits.clone()
        if banned:
            where = to_device(self.device, [i for i, _ in banned], torch.long)
            ids = to_device(self.device, [t for _, t in banned], torch.long)
            logits.index_put_((where, ids), logits.new_full((), float("-inf")))
        if not at:
            return logits, None
        rows = to_device(self.device, at, torch.long)
        held = to_device(self.device, slots, torch.long)
        sp = [batch.rows[i].sampling for i in at]
        counts = self.counts.index_select(0, held)
        seen = self.prompt.index_select(0, held) | (counts > 0)
        picked = logits.index_select(0, rows)
        rep = to_device(self.device, [s.repetition_penalty for s in sp], torch.float32)[:, None]
        picked = torch.where(seen, torch.where(picked > 0, picked / rep, picked * rep), picked)
        freq = to_device(self.device, [s.frequency_penalty for s in sp], torch.float32)[:, None]
        pres = to_device(self.device, [s.presence_penalty for s in sp], torch.float32)[:, None]
        picked = picked - freq * counts - pres * (counts > 0)
        logits.index_copy_(0, rows, picked)
        return logits, (rows, held)

    def count(self, tokens: torch.Tensor, counting: Counting) -> None:
        """The step's sampled tokens added to their sequences' counts, on the device."""
        if counting is None:
            return
        rows, held = counting
        ids = tokens.index_select(0, rows).to(torch.long)
        one = torch.ones_like(ids, dtype=torch.int32)
        self.counts.index_put_((held, ids), one, accumulate=True)


# The rows whose sampled token is counted, and their slots (device tensors); None: none.
Counting = tuple[torch.Tensor, torch.Tensor] | None
