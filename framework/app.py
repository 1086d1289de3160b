"""From a composed config to a finished run: load, build, serve, check, write, report."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from framework.block_pool import BlockPool
from framework.config import check_engine
from framework.engine import Engine, Limits, Policies, RunResult
from framework.executor import HFExecutor
from framework.kv_cache import KVCache, blocks_in_budget, bytes_per_block
from framework.model_loader import TinySpec, load_model, resolve_dtype
from framework.registry import registry
from framework.report import write_results
from framework.workloads import build_workload

log = logging.getLogger(__name__)


@dataclass
class RunInfo:
    """What observers learn about a run (`on_run_start`, `on_run_end`)."""

    config: DictConfig
    output_dir: Path
    num_requests: int
    result: RunResult | None = None
    texts: dict[str, str] = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={name}: CUDA is not available here; use device=cpu or auto")
        return torch.device(name)
    raise ValueError(f"device must be one of auto, cpu, cuda, cuda:N; got {name!r}")


def build_policies(cfg: DictConfig) -> Policies:
    reg = registry()
    groups = ("scheduler", "allocator", "preemption", "output")
    # Resolved first: a policy field may interpolate a top-level value (`window: ${window}`).
    built = {
        g: reg.build(g, OmegaConf.create(OmegaConf.to_container(cfg[g], resolve=True)))
        for g in groups
    }
    names = {g: cfg[g].name for g in built}
    providers = {g: reg.get(g, n).provider.label for g, n in names.items()}
    return Policies(**built, names=names, providers=providers)


def model_dims(model: Any) -> tuple[int, int, int]:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers, c.num_key_value_heads, head_dim


def load(cfg: DictConfig) -> tuple[Any, Any, torch.device, torch.dtype]:
    """(model, tokenizer, device, dtype) for a config; the slow part, reusable across runs."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    tiny = TinySpec(**OmegaConf.to_container(cfg.model.tiny)) if "tiny" in cfg.model else None
    model, tokenizer = load_model(
        cfg.model.source, cfg.model.path, cfg.model.cache_dir, dtype, device, tiny
    )
    return model, tokenizer, device, dtype


def build_engine(
    cfg: DictConfig, model: Any, device: torch.device, dtype: torch.dtype, hooks: Any
) -> Engine:
    """Pool, cache, executor and policies for one run over an already loaded model."""
    policies = build_policies(cfg)
    e = cfg.engine
    layers, kv_heads, head_dim = model_dims(model)
    per_block = bytes_per_block(layers, kv_heads, head_dim, e.block_size, dtype)
    num_blocks = (
        e.num_blocks if e.num_blocks is not None else blocks_in_budget(e.kv_memory_mb, per_block)
    )
    if num_blocks < 1:
        raise ValueError(
            f"engine.kv_memory_mb={e.kv_memory_mb} holds no block of {per_block} bytes; "
            f"raise it or set engine.num_blocks"
        )
    pool = BlockPool(num_blocks, e.block_size)
    cache = KVCache(layers, num_blocks, e.block_size, kv_heads, head_dim, dtype, device)
    max_len = cfg.model.max_model_len or model.config.max_position_embeddings
    limits = Limits(e.max_num_seqs, e.max_num_batched_tokens, max_len)
    return Engine(
        HFExecutor(model, cache, device),
        pool,
        cache.scratch_block,
        policies,
        limits,
        hooks,
        check_invariants=e.check_invariants,
        device=device,
    )


def serve(
    cfg: DictConfig, output_dir: Path, hooks: Any, loaded: tuple[Any, ...] | None = None
) -> RunInfo:
    """Run one configured job end to end and write its results into `output_dir`."""
    # First: a bad limit, policy name or option fails before the model loads.
    check_engine(cfg.engine)
    build_policies(cfg)
    resolve_device(cfg.device)
    resolve_dtype(cfg.dtype)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(cfg.seed)
    model, tokenizer, device, dtype = loaded or load(cfg)
    specs = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), tokenizer)
    engine = build_engine(cfg, model, device, dtype, hooks)

    info = RunInfo(config=cfg, output_dir=output_dir, num_requests=len(specs))
    hooks.on_run_start(run=info)
    result = engine.run(specs, tokenizer.eos_token_id)
    info.result = result
    info.texts = {
        s.id: tokenizer.decode(s.output_token_ids, skip_special_tokens=True) for s in result.seqs
    }
    write_results(output_dir, cfg, result, info.texts)
    hooks.on_run_end(run=info, summary=result.summary)
    return info
