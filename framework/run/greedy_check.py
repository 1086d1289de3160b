"""Greedy outputs compared token for token, with one tie rule shared by the tests and the
benchmark.

Two greedy decoders of the same model must produce the same tokens. The one exception is a
genuine tie: where the two top logits are closer than `TIE`, fp32 noise from a different
batch shape (padding, packing, another kernel) may flip the argmax. So at the first position
where the outputs differ, the reference model's logits over the reference prefix are
computed; a gap of at most `TIE` between the two tokens is an accepted tie (the rest of the
outputs may then differ, since each continues a different prefix), a larger gap is a
mismatch. Outputs of different lengths, without a tie before the end, are a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

TIE = 1e-4  # logits closer than this are a genuine tie: fp32 batch-shape noise may flip them


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
            gap = abs(float(logits[ours[i]] - logits[ref[i]]))
            div = Divergence(rid, i, ours[i], ref[i], gap)
            if gap <= TIE:
                return GreedyComparison(True, div)
            return GreedyComparison(
                False,
                div,
                f"{rid}: token {i} differs (ours {ours[i]}, reference {ref[i]}); logit gap "
                f"{gap:.3g} > {TIE}: not a tie, a bug",
            )
    if len(ours) != len(ref):
        return GreedyComparison(False, None, f"{rid}: {len(ours)} tokens, reference {len(ref)}")
    return GreedyComparison(True)
