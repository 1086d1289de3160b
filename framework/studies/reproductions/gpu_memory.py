"""What a paper's KV pool is, for the model and GPU asked: one GPU's memory less its share of
the weights, as the papers' systems size it. A reproduction states its paper's rule with
these, so that a run about another model, GPU or parallelism gets the pool that rule gives
there, not the paper's number."""

from __future__ import annotations

import json
from pathlib import Path

from framework.executors.simulated.gpu.hardware import load_hardware_spec
from framework.executors.simulated.gpu.model_shape import ModelShape

FP16_BYTES = 2


def shape(model: str | Path) -> ModelShape:
    """The model's shape, from its folder's config.json."""
    return ModelShape.from_config(json.loads((Path(model) / "config.json").read_text()))


def gpu_bytes(hardware: str) -> float:
    """One GPU's memory in bytes (the hardware spec's `memory_capacity`)."""
    return float(load_hardware_spec(hardware)["memory_capacity"])


def weight_bytes(model: str | Path, tp: int = 1, itemsize: int = FP16_BYTES) -> float:
    """One GPU's share of the model's weights under tensor parallelism `tp`."""
    return itemsize * shape(model).total_params / tp


def kv_tokens(
    model: str | Path, hardware: str, tp: int, utilization: float, itemsize: int = FP16_BYTES
) -> int:
    """The token slots an engine's KV pool holds when it takes `utilization` of each GPU's
    memory and keeps the weights' share in it (vLLM's `gpu_memory_utilization`, SGLang's
    `mem_fraction_static`): each of the `tp` GPUs holds its share of every token's K and V.
    The peak activation memory the engines also set aside is not modelled, so this is an
    upper bound. 0 when the weights leave nothing."""
    free = utilization * gpu_bytes(hardware) - weight_bytes(model, tp, itemsize)
    per_token = shape(model).kv_elements_per_token / tp * itemsize
    return max(0, int(free // per_token))
