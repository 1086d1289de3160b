"""Shared test machinery: compose configs as the CLI does, build engines over a loaded model,
and compare greedy output against Hugging Face `generate` with the tie rule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from framework.app import build_engine
from framework.config import register_configs
from framework.engine import RunResult
from framework.registry import registry
from framework.request import RequestSpec

ROOT = Path(__file__).resolve().parents[1]
TIE = 1e-4  # logits closer than this are a genuine tie: fp32 batch-shape noise may flip them

register_configs()


def make_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose(config_name="config", overrides=list(overrides))


def run_engine(cfg: DictConfig, model: Any, tokenizer: Any, specs: list[RequestSpec]) -> RunResult:
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    return engine.run(specs, tokenizer.eos_token_id)


def hf_greedy(model: Any, prompt_ids: list[int], max_new: int, eos: int | None) -> list[int]:
    """Batch-1 greedy decoding by Hugging Face, the reference every policy must match."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )
    finally:
        model.set_attn_implementation(previous)
    return out[0, len(prompt_ids) :].tolist()


@dataclass
class Divergence:
    request: str
    position: int
    ours: int
    ref: int
    gap: float


def logits_at(model: Any, ids: list[int]) -> torch.Tensor:
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            return model(torch.tensor([ids])).logits[0, -1].float()
    finally:
        model.set_attn_implementation(previous)


def check_same_greedy(
    model: Any, prompt: list[int], rid: str, ours: list[int], ref: list[int]
) -> Divergence | None:
    """Ours must equal ref, except where they first differ at a genuine tie (then None is
    not returned: the caller prints the Divergence). Any other difference fails."""
    n = min(len(ours), len(ref))
    for i in range(n):
        if ours[i] != ref[i]:
            logits = logits_at(model, prompt + ref[:i])
            gap = abs(float(logits[ours[i]] - logits[ref[i]]))
            assert gap <= TIE, (
                f"{rid}: token {i} differs (ours {ours[i]}, reference {ref[i]}); logit gap "
                f"{gap:.3g} > {TIE}: not a tie, a bug"
            )
            div = Divergence(rid, i, ours[i], ref[i], gap)
            print(f"tie accepted: {div}")
            return div
    assert len(ours) == len(ref), f"{rid}: {len(ours)} tokens, reference {len(ref)}"
    return None
