"""Logits to tokens, each request with its own seeded draws, with no host sync on a GPU.

A request's k-th token is drawn from softmax(filtered logits / temperature) by the
Gumbel-max rule: argmax(logits + g), where each vocabulary entry's noise g = -log(-log(u))
comes from a uniform u that is a hash of (the draw seed of (request seed, k), the entry).
So the draw depends on (seed, k) alone, never on batch composition, policies, preemption (a
recomputed token is drawn again identically) or on tokens other requests consumed; and every
sampled row of a step is drawn at once, on the device, from counters rather than a
generator's state: no generator is made, no value is read back, no boolean index makes the
host wait (top-k and top-p are masks over one sort, scattered back).
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


def _signed(c: int) -> int:
    """A 64-bit constant as torch's int64 holds it (two's complement)."""
    return c - (1 << 64) if c >= 1 << 63 else c


# splitmix64's finaliser (Steele, Lea and Flood), on int64 tensors: multiplications wrap as
# unsigned ones do, and a logical right shift is an arithmetic one masked to its width.
_GAMMA = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x + _GAMMA
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniforms(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] float64 uniforms in (0, 1): entry j of row r hashes (seeds[r], j)."""
    j = torch.arange(vocab, device=seeds.device, dtype=torch.long)
    x = _mix(_mix(seeds[:, None]) ^ j[None, :])
    return (_shr(x, 11).to(torch.float64) + 0.5) * 2.0**-53


def gumbel(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """Each row's Gumbel(0, 1) noise over the vocabulary, from its draw seed alone."""
    return -torch.log(-torch.log(uniforms(seeds, vocab)))


def filter_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """[rows, vocab] logits with the tokens outside each row's top-k (0: no cut; ties with
    the k-th value kept), outside its top-p nucleus (the smallest head whose mass reaches
    top_p; the first token always stays) and, where `min_p` is given, less likely than
    min_p x its most likely token (after top-k), set to -inf: one sort, masks, one scatter."""
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth = ordered.gather(1, (k - 1)[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p[:, None]
    ordered = ordered.masked_fill(drop & (top_p[:, None] < 1.0), float("-inf"))
    if min_p is not None:  # the most likely is first: probs[:, :1]
        ordered = ordered.masked_fill(probs < min_p[:, None] * probs[:, :1], float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, ordered)


def to_device(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A small host list on `device` without a sync: pinned, copied asynchronously (the
    caching host allocator keeps the pinned block until its copy is done)."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def sample(logits: torch.Tensor, rows: list[Row], argmax: Argmax | None = None) -> torch.Tensor:
    """Sampled token ids [B] on the logits' device; greedy rows in one argmax (`argmax`:
    nanoserve's CPU kernel where the executor chose it, the same index as torch.argmax),
    the sampled rows in one draw (see the module's note)."""
    tokens = argmax(logits) if argmax is not None else torch.argmax(logits, dim=-1)
    drawn = [
        i
        for i, row in enumerate(rows)
        if not (row.sampling.greedy or row.padding or not row.samples)  # no draw unkept
    ]
    if not drawn:
        return tokens
    dev = logits.device
    params = [rows[i].sampling for i in drawn]
    at = to_device(dev, drawn, torch.long)
    temperature = to_device(dev, [sp.temperature for sp in params], torch.float32)
    seeds = to_device(dev, [draw_seed(rows[i].sampling.seed, rows[i].token_index) for i in drawn],
                torch.long)  # fmt: skip
    scaled = logits.index_select(0, at).float() / temperature[:, None]
    # The filter sorts the whole vocabulary; where no row cuts it (top_k 0, top_p 1, no
    # min_p: known on the host from the requests) it would keep every logit as it is.
    if any(sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p for sp in params):
        top_k = to_device(dev, [sp.top_k for sp in params], torch.long)
        top_p = to_device(dev, [sp.top_p for sp in params], torch.float32)
        min_p = None
        if any(sp.min_p for sp in params):
            min_p = to_device(dev, [sp.min_p for sp in params], torch.float32)
        scaled = filter_logits(scaled, top_k, top_p, min_p)
    choice = torch.argmax(scaled.double() + gumbel(seeds, logits.shape[-1]), dim=-1)
    return tokens.index_copy(0, at, choice.to(tokens.dtype))
