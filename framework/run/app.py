"""From a composed config to a finished run: load, build, run the batch, check, write, report."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf

from framework.api.policy import Allocator, Scheduler, overrides
from framework.cluster.outages import parse_outages
from framework.core.request import RequestSpec
from framework.engine.block_pool import BlockPool
from framework.engine.clock import Clock, VirtualClock, WallClock
from framework.engine.contiguous_pool import ContiguousPool
from framework.engine.executor import Executor
from framework.engine.kv_cache import KVCache, blocks_in_budget, bytes_per_block
from framework.engine.loop import Engine
from framework.engine.prefix_cache import PrefixCachingPool
from framework.engine.settings import Limits, Policies
from framework.executors.model_loader import (
    TinySpec,
    load_model,
    load_model_config,
    resolve_dtype,
)
from framework.executors.simulated.executor import SimulatedExecutor
from framework.plugin_host.faults import guard_hooks
from framework.plugin_host.registry import registry
from framework.run.cluster_run import ClusterRunner, build_router
from framework.run.config_checks import check_host_tier, check_run, check_window
from framework.run.disaggregation import build_handoffs, decode_router, link_setting
from framework.run.errors import user_input
from framework.run.fits import check_fits
from framework.run.report import decode_outputs, mark_complete, write_results
from framework.run.run_info import RunInfo
from framework.run.simulation import ModelShape, build_simulated, is_simulated
from framework.run.stopped import abort
from framework.run.summary import summarize
from framework.workloads import build_workload, check_workload

if TYPE_CHECKING:
    from framework.run.ray_replicas import RayRunner

log = logging.getLogger(__name__)


def start_run(info: RunInfo, hooks: Any, began: float) -> None:
    """Tell the observers the run starts, and keep what came before the engine's clock
    apart from every time the run measures, as its start-up: `startup_load_s`, from `began`
    (`time.perf_counter()` as the run was called) to here (the model loaded unless it was
    given, the engine built, its kernels chosen), and `startup_observers_s`, the observers'
    own starts (the MLflow run opened in its store, a new store made first)."""
    loaded = time.perf_counter()
    info.startup["startup_load_s"] = loaded - began
    try:
        hooks.on_run_start(run=info)
    finally:
        info.startup["startup_observers_s"] = time.perf_counter() - loaded


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={name}: CUDA is not available here; use device=cpu or auto")
        index = name.partition(":")[2]
        count = torch.cuda.device_count()
        if index and (not index.isdigit() or int(index) >= count):
            present = ", ".join(f"cuda:{i}" for i in range(count))
            raise ValueError(
                f"device={name}: not available; this machine has {present} "
                f"(use device=auto, cpu, cuda or one of those)"
            )
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
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads  # OPT: MHA
    return c.num_hidden_layers, kv_heads, head_dim


def on_ray(cfg: DictConfig) -> bool:
    """The replicas load the model themselves, as Ray actors (`cluster.backend=ray`)."""
    return cfg.get("cluster") is not None and cfg.cluster.backend == "ray"


def tiny_fields(node: DictConfig) -> dict[str, Any]:
    """`model.tiny`'s fields as keyword arguments (a mapping node, as its schema makes it)."""
    fields = OmegaConf.to_container(node)
    assert isinstance(fields, dict)
    return {str(k): v for k, v in fields.items()}


def load(cfg: DictConfig, weights: bool = True) -> tuple[Any, Any, torch.device, torch.dtype]:
    """(model, tokenizer, device, dtype) for a config; the slow part, reusable across runs.
    Without `weights` (a simulation, or replicas that load their own), the model's shape."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    tiny = TinySpec(**tiny_fields(cfg.model.tiny)) if "tiny" in cfg.model else None
    if is_simulated(cfg) or not weights:  # the shape and tokenizer, no weights; on the host
        config, tokenizer = load_model_config(
            cfg.model.source, cfg.model.path, cfg.model.cache_dir, tiny
        )
        return ModelShape(config, tokenizer.eos_token_id), tokenizer, torch.device("cpu"), dtype
    model, tokenizer = load_model(
        cfg.model.source,
        cfg.model.path,
        cfg.model.cache_dir,
        dtype,
        device,
        tiny,
        bool(cfg.model.get("random_weights", False)),
    )
    return model, tokenizer, device, dtype


def build_engine(
    cfg: DictConfig,
    model: Any,
    device: torch.device,
    dtype: torch.dtype,
    hooks: Any,
    say: bool = True,
    clock: Clock | None = None,
) -> Engine:
    """Pool, cache, executor and policies for one run over an already loaded model (`say`:
    whether a simulated one says which profile it uses; a cluster's first replica does).
    `clock`: the engine's clock where not the executor's own (a simulator's virtual clock,
    else the wall clock)."""
    given = clock
    policies = build_policies(cfg)
    e = cfg.engine
    layers, kv_heads, head_dim = model_dims(model)
    if is_simulated(cfg):  # the pool is one GPU's: its shard of the KV heads (Megatron)
        kv_heads = max(1, -(-kv_heads // int(cfg.executor.tensor_parallel)))
    per_block = bytes_per_block(layers, kv_heads, head_dim, e.block_size, dtype)
    num_blocks = (
        e.num_blocks if e.num_blocks is not None else blocks_in_budget(e.kv_memory_mb, per_block)
    )
    if num_blocks < 1:
        raise ValueError(
            f"engine.kv_memory_mb={e.kv_memory_mb} holds no block of {per_block} bytes; "
            f"raise it or set engine.num_blocks"
        )
    host_blocks = 0
    if e.host_kv_memory_mb > 0:  # the host KV tier, where preemption may swap
        host_blocks = blocks_in_budget(e.host_kv_memory_mb, per_block)
        if host_blocks < 1:
            raise ValueError(
                f"engine.host_kv_memory_mb={e.host_kv_memory_mb} holds no block of {per_block} "
                "bytes; raise it, or 0 for no host tier"
            )
    if getattr(policies.allocator, "caches_prefixes", False):  # allocator=prefix_cache
        # The salt keeps two models' or dtypes' K/V apart, should one pool ever serve both.
        salt = f"{cfg.model.source}:{cfg.model.get('path')}:{dtype}"
        # An eviction order of its own, if any (the default is the pool's O(1) LRU).
        own = overrides(policies.allocator, Allocator, "choose_eviction")
        choose = policies.allocator.choose_eviction if own else None
        pool: BlockPool = PrefixCachingPool(num_blocks, e.block_size, salt, choose)
    elif e.kv_layout == "contiguous":  # one extent a request, from a buddy allocator
        pool = ContiguousPool(num_blocks, e.block_size)
    else:
        pool = BlockPool(num_blocks, e.block_size)
    if host_blocks and pool.caches_prefixes:  # shared and copied back apart: not built
        raise ValueError("engine.host_kv_memory_mb > 0 takes an allocator that caches no prefixes")
    max_len = cfg.model.max_model_len or model.config.max_position_embeddings
    limits = Limits(e.max_num_seqs, e.max_num_batched_tokens, max_len)
    executor: Executor
    if is_simulated(cfg):  # no KV tensors: the scratch block is only a number
        executor, clock = build_simulated(cfg, model, say, per_block, host_tier=bool(host_blocks))
        scratch = num_blocks
    else:
        # The real executor's modules (transformers' modelling code) only where a model
        # runs: a simulated run starts 3.5 s sooner without them.
        from framework.executors.cache_lease import Geometry, lend
        from framework.executors.decode_graphs import choose_graphs
        from framework.executors.hf import HFExecutor

        graphs, lease = choose_graphs(e.cuda_graphs, device), None
        if graphs.use:  # the process's cache and graphs, captured once for every engine
            shape = Geometry(layers, e.block_size, kv_heads, head_dim, dtype, device)
            lease = lend(model, shape, num_blocks)
            cache = lease.cache
        else:
            cache = KVCache(layers, num_blocks, e.block_size, kv_heads, head_dim, dtype, device)
        executor = HFExecutor(
            model,
            cache,
            device,
            packed_linears=e.packed_linears,
            small_linear=e.small_linear,
            paged_kernel=e.paged_kernel,
            argmax_kernel=e.argmax_kernel,
            layer_glue=e.layer_glue,
            flex_decode=e.flex_decode,
            flex_prefill=e.flex_prefill,
            graphs=graphs,
            lease=lease,
            max_num_seqs=e.max_num_seqs,
            max_len=max_len,
            host_blocks=host_blocks,
        )
        clock, scratch = WallClock(), cache.scratch_block
    return Engine(
        executor,
        pool,
        scratch,
        policies,
        limits,
        hooks,
        check_invariants=e.check_invariants,
        device=device,
        clock=given if given is not None else clock,
        host_pool=BlockPool(host_blocks, e.block_size) if host_blocks else None,
        kv_block_bytes=per_block,
    )


def build_runner(
    cfg: DictConfig,
    model: Any,
    device: torch.device,
    dtype: torch.dtype,
    hooks: Any,
    say: bool = True,
) -> Engine | ClusterRunner | RayRunner:
    """One engine, or `cluster.replicas` of them behind the configured router: in this
    process, or as Ray actors (`cluster.backend=ray`). `say`: whether a simulated run says
    which profile it uses (once, by its first replica); a study's many runs keep quiet."""
    replicas = int(cfg.cluster.replicas)
    if cfg.cluster.backend == "ray":
        from framework.run.ray_replicas import RayRunner

        return RayRunner(cfg, replicas, build_router(cfg), (load, build_engine))
    if replicas == 1:
        return build_engine(cfg, model, device, dtype, hooks, say)
    router, name, provider = build_router(cfg)
    # The real executor's replicas take turns on this machine, over one model in memory:
    # each replica's clock counts the measured time of its own steps only (a virtual clock
    # under measured host time), and arrivals are replayed without waiting.
    turns = not is_simulated(cfg)
    engines = [
        build_engine(
            cfg, model, device, dtype, hooks, say and i == 0, VirtualClock() if turns else None
        )
        for i in range(replicas)
    ]
    roles, handoffs = build_handoffs(cfg, engines, model, dtype)
    if turns:
        print(
            f"cluster: {replicas} replicas of executor=model take turns in this process; each "
            "replica's times are its own steps' measured seconds, as if it ran alone on this "
            "machine, and arrivals are replayed without waiting (cluster.backend=ray runs "
            "them at once, each in its own process)",
            file=sys.stderr,
        )
    link = link_setting(cfg).describe() | {"layerwise": bool(cfg.cluster.layerwise)}
    faults = cfg.cluster.get("faults")
    outages = parse_outages(OmegaConf.to_container(faults) if faults else None, replicas)
    return ClusterRunner(engines, router, name, provider, roles, handoffs, link, outages)


def check_before_loading(cfg: DictConfig) -> None:
    """Every check that needs no model: limits, settings, policy names and options, the
    device, the model folder, the workload's fields and files, and (when the workload's
    sizes and the pool are both known without the model) whether any request fits."""
    check_run(cfg)
    build_router(cfg)  # its options checked whatever the cluster's size
    if cfg.router.get("decode"):
        decode_router(cfg)  # a decode router that does not exist, by name
    policies = build_policies(cfg)
    chunks = overrides(policies.scheduler, Scheduler, "chunk")
    if cfg.engine.kv_layout == "contiguous" and cfg.allocator.name != "worst_case":
        raise ValueError(
            "engine.kv_layout=contiguous keeps each request's KV in one extent reserved whole "
            f"at admission: it takes allocator=worst_case; got allocator={cfg.allocator.name}"
        )
    check_host_tier(cfg, policies)
    check_window(cfg)
    resolve_device(cfg.device)
    resolve_dtype(cfg.dtype)
    sizes = check_workload(OmegaConf.to_container(cfg.workload, resolve=True))
    e = cfg.engine
    if sizes is not None:  # the pool is known only if set in blocks (else: after loading)
        check_fits(
            sizes,
            num_blocks=e.num_blocks,
            block_size=e.block_size,
            max_model_len=cfg.model.max_model_len,
            # a scheduler that chunks prefills serves a request longer than the budget
            max_num_batched_tokens=None if chunks else e.max_num_batched_tokens,
            pool_source=f"engine.num_blocks={e.num_blocks}",
        )


def check_engine_fits(cfg: DictConfig, engine: Engine, specs: list[RequestSpec]) -> None:
    """No request of the workload fits the built engine: stop before the first step."""
    e = cfg.engine
    source = (
        f"engine.num_blocks={e.num_blocks}"
        if e.num_blocks is not None
        else f"engine.kv_memory_mb={e.kv_memory_mb}"
    )
    check_fits(
        [len(s.prompt_token_ids) + s.sampling.max_tokens for s in specs],
        num_blocks=engine.pool.num_blocks,
        block_size=engine.pool.block_size,
        max_model_len=engine.limits.max_model_len,
        max_num_batched_tokens=None
        if engine.cuts_prefills
        else engine.limits.max_num_batched_tokens,
        pool_source=source,
    )
    tier = engine.planner.tier
    if tier is not None and specs:
        smallest = min(len(s.prompt_token_ids) + s.sampling.max_tokens for s in specs)
        need = tier.pool.blocks_for(smallest)
        if tier.pool.num_blocks < need:
            mb = need * tier.block_bytes / 2**20
            raise ValueError(
                f"engine.host_kv_memory_mb={e.host_kv_memory_mb} holds {tier.pool.num_blocks} "
                f"blocks, too few for any request's KV (the smallest needs {need}): set it >= "
                f"{mb:.1f}, or 0 for no host tier"
            )


def run_batch(
    cfg: DictConfig, output_dir: Path, hooks: Any, loaded: tuple[Any, ...] | None = None
) -> RunInfo:
    """Run one configured job end to end and write its results into `output_dir`.

    Bad input raises `UserError` before anything is written. A run that stops early (an
    exception anywhere in the run, a broken invariant, a policy or observer that raises,
    Ctrl-C) still writes what it measured, marked incomplete, tells the observers
    (`on_run_abort`), and then re-raises: the caller sees the error.
    """
    began = time.perf_counter()
    # Up to the first step, everything read is the user's input: a ValueError or OSError
    # here is theirs to fix (UserError, one line at the command line), and nothing is written.
    with user_input():
        check_before_loading(cfg)  # first: bad input fails before the model loads
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        torch.manual_seed(cfg.seed)
        model, tokenizer, device, dtype = loaded or load(cfg, weights=not on_ray(cfg))
        specs = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), tokenizer)
        hooks = guard_hooks(hooks, registry())
        runner = build_runner(cfg, model, device, dtype, hooks)
        engine = runner.engines[0] if isinstance(runner, ClusterRunner) else runner
        if isinstance(engine, Engine):  # (Ray's replicas each refuse what cannot fit)
            check_engine_fits(cfg, engine, specs)
            if isinstance(engine.executor, SimulatedExecutor):
                engine.executor.tokens.check_covers([s.id for s in specs])

    info = RunInfo(config=cfg, output_dir=output_dir, num_requests=len(specs))
    try:
        start_run(info, hooks, began)
        result = runner.run(specs, tokenizer.eos_token_id)
        info.result = result
        info.texts = decode_outputs(tokenizer, result)
    except BaseException as error:  # Ctrl-C included: the measurements so far are kept
        abort(info, runner, tokenizer, hooks, error)
        raise
    info.summary = mark_complete(summarize(result) | info.startup)
    write_results(output_dir, cfg, result, info.summary, info.texts)
    hooks.on_run_end(run=info, summary=info.summary)
    return info
