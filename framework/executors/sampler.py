"""Logits to tokens, each request with its own seeded draws.

A request's k-th token is drawn with a generator seeded from (request seed, k) alone, so its
text does not depend on batch composition, policies, preemption (a recomputed token is drawn
again identically) or on tokens that other requests consumed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from framework.engine.batch import Row

Argmax = Callable[[torch.Tensor], torch.Tensor]  # [rows, vocab] -> [rows], first largest

SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, index) over the seeds
SEED_STEP = 0x100000001B3  # the FNV prime: one token index apart, far apart in seed space
SEED_MOD = 2**63 - 1


def draw_seed(seed: int, token_index: int) -> int:
    return (seed * SEED_MIX + token_index * SEED_STEP + 1) % SEED_MOD


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask out tokens outside top-k and outside the top-p nucleus (1-D logits)."""
    if top_k > 0 and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def sample(logits: torch.Tensor, rows: list[Row], argmax: Argmax | None = None) -> torch.Tensor:
    """Sampled token ids [B] on the logits' device; greedy rows in one argmax (`argmax`:
    nanoserve's CPU kernel where the executor chose it, the same index as torch.argmax)."""
    tokens = argmax(logits) if argmax is not None else torch.argmax(logits, dim=-1)
    for i, row in enumerate(rows):
        sp = row.sampling
        if sp.greedy or row.discard or not row.samples:  # no draw for a token nobody keeps
            continue
        scaled = filter_logits(logits[i].float() / sp.temperature, sp.top_k, sp.top_p)
        probs = torch.softmax(scaled, dim=-1)
        gen = torch.Generator(device=logits.device)
        gen.manual_seed(draw_seed(sp.seed, row.token_index))
        tokens[i] = torch.multinomial(probs, 1, generator=gen)[0]
    return tokens
