"""Greedy outputs compared token for token, with one tie rule shared by the tests and the
benchmark.

Two greedy decoders of the same model must produce the same tokens. The one exception is a
genuine tie: where the two top logits are closer than the tolerance, rounding noise from a
different batch shape (padding, packing, another kernel) may flip the argmax. So at the first
position where the outputs differ, the reference model's logits over the reference prefix are
computed (in the model's own dtype); a gap within the tolerance between the two tokens is an
accepted tie (the rest of the outputs may then differ, since each continues a different
prefix), a larger gap is a mismatch. Outputs of different lengths, without a tie before the
end, are a mismatch.

The tolerance fits the dtype (`tie_tolerance`):
- float32: `TIE` = 1e-4, absolute. fp32 noise from another summation order is ~1e-6.
- bfloat16 and float16: `HALF_ULPS` = 4 units in the last place, in that dtype, of the
  position's largest logit in magnitude (over the whole vocabulary). The noise is absolute,
  set by the scale of the hidden state, not by the two logits compared: measured on SmolLM2
  bf16, left-padding one prompt by 7 or 23 tokens (as a static batch does) moved logits by
  up to 0.375 and 0.5 where the largest was 31.75 (a unit there is 0.125), and a flat
  position's top two logits, 1.86 and 1.82, swapped. The engine against HF `generate` (packed
  or stock Linear, kernel or SDPA attention, every scheduler and allocator) first differed
  0 to 2 units apart (0.125 or 0.25 at that scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

TIE = 1e-4  # fp32: logits closer than this are a genuine tie (batch-shape noise may flip them)
HALF_ULPS = 4  # bf16 / fp16: ties within this many units of the position's largest logit


def tie_tolerance(dtype: torch.dtype, scale: float) -> float:
    """The largest logit gap that is a genuine tie for a model computing in `dtype`, at a
    position whose largest logit in magnitude is `scale` (see the module)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return TIE
    info = torch.finfo(dtype)
    top = max(abs(scale), info.tiny)
    # eps is the spacing just above 1.0 (2^-7 for bf16, 2^-10 for fp16): one unit at `top`
    return HALF_ULPS * info.eps * 2.0 ** math.floor(math.log2(top))


@dataclass
class Divergence:
    request: str
    position: int
    ours: int
    ref: int
    gap: float


@dataclass(frozen=True)
class GreedyComparison:
    """`equal`: the same tokens, or the same up to a genuine tie (`divergence` says where).
    Otherwise `reason` says what differs, and `divergence` where, when a token did."""

    equal: bool
    divergence: Divergence | None = None
    reason: str = ""


def logits_at(model: Any, ids: list[int]) -> torch.Tensor:
    """The model's next-token logits after `ids` (plain batch-1 forward, sdpa attention)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            return model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
    finally:
        model.set_attn_implementation(previous)


def compare_greedy(
    model: Any, prompt: list[int], rid: str, ours: list[int], ref: list[int]
) -> GreedyComparison:
    """Compare request `rid`'s greedy output `ours` against `ref` under the tie rule."""
    for i in range(min(len(ours), len(ref))):
        if ours[i] != ref[i]:
            logits = logits_at(model, prompt + ref[:i])
            a, b = float(logits[ours[i]]), float(logits[ref[i]])
            gap = abs(a - b)
            div = Divergence(rid, i, ours[i], ref[i], gap)
            tol = tie_tolerance(next(model.parameters()).dtype, float(logits.abs().max()))
            if gap <= tol:
                return GreedyComparison(True, div)
            return GreedyComparison(
                False,
                div,
                f"{rid}: token {i} differs (ours {ours[i]}, reference {ref[i]}); logit gap "
                f"{gap:.3g} > {tol:.3g}: not a tie, a bug",
            )
    if len(ours) != len(ref):
        return GreedyComparison(False, None, f"{rid}: {len(ours)} tokens, reference {len(ref)}")
    return GreedyComparison(True)
