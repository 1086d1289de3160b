"""Hydra structured configs: the schema behind `conf/` and every command-line override."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from framework.model_loader import TinySpec


@dataclass
class EngineConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int | None = None  # explicit pool size; None: size it from kv_memory_mb
    kv_memory_mb: float = 256.0
    check_invariants: bool = True


@dataclass
class ModelConfig:
    source: str = "smollm2"  # smollm2 | tiny | hf
    path: str | None = None  # model=hf: a local Hugging Face model folder
    cache_dir: str | None = None  # where the dequantised SmolLM2 is kept (~/.cache/nanoserve)
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    tiny: TinySpec = field(default_factory=TinySpec)


@dataclass
class RunConfig:
    scheduler: Any = MISSING
    allocator: Any = MISSING
    preemption: Any = MISSING
    output: Any = MISSING
    model: ModelConfig = MISSING
    workload: Any = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    window: int = 4  # output=deferred: steps of sampled tokens held on the device (0: none)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "float32"  # float32 | bfloat16 | float16
    threads: int | None = None  # torch intra-op threads; None: torch's default
    observers: list[str] = field(default_factory=lambda: ["console"])
    print_outputs: bool = True


def register_configs() -> None:
    """Schemas for the YAML groups, the workloads, and every registered policy."""
    from framework.registry import registry
    from framework.workloads.config import register_workload_configs

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=RunConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    register_workload_configs(cs)
    registry().store_configs(cs)


def check_engine(e: Any) -> None:
    """Reject bad engine limits before any model is loaded, naming the field."""
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if e[name] < 1:
            raise ValueError(f"engine.{name} must be >= 1, got {e[name]}")
    if e.num_blocks is not None and e.num_blocks < 1:
        raise ValueError(
            f"engine.num_blocks must be >= 1 (or null: size from kv_memory_mb), got {e.num_blocks}"
        )
    if e.num_blocks is None and e.kv_memory_mb <= 0:
        raise ValueError(f"engine.kv_memory_mb must be > 0, got {e.kv_memory_mb}")
    if e.max_num_batched_tokens < e.max_num_seqs:
        raise ValueError(
            f"engine.max_num_batched_tokens ({e.max_num_batched_tokens}) must be >= "
            f"engine.max_num_seqs ({e.max_num_seqs}): every row costs at least one token"
        )
