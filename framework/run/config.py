"""Hydra structured configs: the schema behind `conf/` and every command-line override."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from framework.executors.model_loader import TinySpec
from framework.run.server_config import ServerConfig


@dataclass
class EngineConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int | None = None  # explicit pool size; None: size it from kv_memory_mb
    kv_memory_mb: float = 256.0
    # The host KV tier (vLLM's swap space): host memory for the KV of requests preempted by
    # swap (`preemption.mode=swap|cheaper`), in MB. 0: none, every preemption recomputes.
    host_kv_memory_mb: float = 0.0
    # How a request's KV blocks lie in the pool: paged (any free block, as vLLM) or
    # contiguous (one extent per request from a buddy allocator, reserved whole at admission,
    # as engines before paging: external fragmentation is real and counted).
    kv_layout: str = "paged"
    check_invariants: bool = True
    # Kernels whose worth depends on the machine: auto (the default) times both ways on
    # this CPU, model, dtype and thread count at start-up and keeps the faster
    # (framework/executors/kernel_choice.py); true / false sets it. What ran, and why, is in
    # metrics.json and MLflow.
    # CPU fp32 / bf16: the Linear layers on weights prepacked for oneDNN
    # (framework/executors/packed_linear.py), or PyTorch's stock linear.
    packed_linears: Any = "auto"
    # CPU fp32 / bf16: the Linear layers up to some row count through nanoserve's Linear
    # kernel (framework/executors/kernels/gemv.cpp); auto measures up to how many rows it pays
    # (a climb over row counts), true runs it at every count, a number N up to N rows. Off
    # where packed_linears=false, unless set true or to a number.
    small_linear: Any = "auto"
    # CPU fp32 / bf16: decode attention reads each row's KV blocks in place with nanoserve's
    # C++ kernel (framework/executors/kernels/, compiled on first use), or gathers the blocks
    # and runs SDPA.
    paged_kernel: Any = "auto"
    # CPU: greedy rows' argmax over the vocabulary with nanoserve's C++ kernel (the same
    # index as torch.argmax, several times faster on a large vocabulary), or torch.argmax.
    argmax_kernel: Any = "auto"
    # Each RMSNorm, add + RMSNorm, rotary and SiLU-and-multiply as one operator: on CPU C++
    # (the eager modules' bits; auto measures), on CUDA torch.compile'd (one Triton kernel
    # each; auto: on where Triton is), or Hugging Face's eager chains (layer_glue.py).
    layer_glue: Any = "auto"
    # flex_attention over the KV blocks in place (framework/executors/flex_paged.py) for the
    # decode rows, and for all prefill rows in one call a layer. auto: on CUDA (compiled);
    # elsewhere today's paths (on CPU it runs eager, over the whole pool).
    flex_decode: Any = "auto"
    flex_prefill: Any = "auto"
    # Decode steps through static buffers per batch bucket, replayed as CUDA graphs
    # (framework/executors/decode_graphs.py): auto on CUDA; true on a CPU: uncaptured.
    cuda_graphs: Any = "auto"


@dataclass
class ExecutorConfig:
    """What runs each step: `model`, the real forward; or `simulated`, the same engine and
    policies with each step's seconds predicted from a profile, on a virtual clock."""

    name: str = "model"  # model | simulated
    # simulated: a profile file (YAML or JSON); null: the shipped one for the run's model x dtype
    profile: str | None = None
    host_time: str = "measured"  # simulated: measured (this machine's engine) | model (profile)
    replay: str | None = None  # simulated: a real run's outputs.jsonl, its tokens by request id
    mean_output_tokens: float = 128.0  # simulated, EOS honoured, no replay: the drawn mean
    any_profile: bool = False  # simulated: accept a profile made for another model or dtype
    # simulated: the machine's speed against the profile's; every predicted second (forward,
    # sampling, modelled host time) is divided by it. 0.8: a machine 20% slower.
    speed: float = 1.0
    # simulated: the forward's compute-bound seconds (prefill tokens, attention products)
    # divided by this instead of `speed`; null: `speed`. A machine of other FLOP/s per byte.
    compute_speed: float | None = None
    # simulated: whether the device runs beside the host (a GPU: deferred output hides the
    # engine's host work behind the forward) or they take turns (a CPU). auto: from the
    # profile (analytic, or measured on CUDA: true); true | false to ask what-if.
    overlap: Any = "auto"
    # simulated, no executor.profile and none measured on this CPU for this model: the GPU
    # whose analytic profile is computed from the run's model config (a shipped spec's
    # name, or a spec file)
    hardware: str = "h100-sxm"
    # simulated, analytic: GPUs a replica spans (1, 2, 4, 8; Megatron tensor parallelism),
    # joined by `interconnect` (dgx: NVSwitch inside an 8-GPU node; nvlink_pair: bridged
    # pairs); null: the hardware spec's `default_interconnect`
    tensor_parallel: int = 1
    interconnect: str | None = None
    # simulated: the serving engine's own software on the virtual clock (a shipped profile of
    # framework/executors/simulated/software/, or a file): its host time per step and row, its
    # kernel launches (eager or CUDA graphs), what it overlaps with the device. `ideal`: none,
    # a step is its kernels plus the hardware spec's round host cost (docs/simulator-software.md)
    software: str = "ideal"
    # simulated, with a software profile whose API server shares the engine's process: charge
    # the server's per-request and per-token work (an online run, as the engine's server)
    api_server: bool = False
    # simulated, under `python serve.py`: `wall` waits out each step's predicted seconds on
    # the wall clock, so the API answers with the profile's timing; `none` answers as fast
    # as this machine simulates. A batch run (`run.py`) is not paced.
    pace: str = "none"
    # simulated, with a host KV tier (engine.host_kv_memory_mb): the link a swap's block
    # copies take (a host link of framework/executors/simulated/links.yaml); null: the
    # hardware spec's `host_link`, or `host_memory` for a profile measured on a CPU
    host_link: str | None = None


@dataclass
class ModelConfig:
    source: str = "smollm2"  # smollm2 | tiny | hf
    path: str | None = None  # model=hf: a local Hugging Face model folder
    cache_dir: str | None = None  # where the dequantised SmolLM2 is kept (~/.cache/nanoserve)
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    tiny: TinySpec = field(default_factory=TinySpec)
    # model=hf: the folder's config with seeded random weights instead of its own. For
    # timing a shape whose weights are not at hand (a GPU machine that cannot fetch them,
    # an 8B config): the text is noise, the counts and seconds are the shape's.
    random_weights: bool = False


@dataclass
class MlflowConfig:
    """Where the `mlflow` observer logs (plugins/observers/mlflow_logger.py)."""

    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment: str = "nanoserve"
    fatal: bool = False  # True: a failing store fails the run (default: say so, keep results)
    # Points per per-step series (`step.rows`, ...): exact up to this many steps, then means
    # over runs of steps (framework/tracking/series.py); steps.csv keeps every step.
    max_step_points: int = 2000
    # Who logs a run: a helper process, logging before the first step and after the last
    # (true), this process (false), or null: the helper for a single run whose store may fail
    # softly, in a process that has not imported mlflow yet (framework/tracking/background.py).
    background: bool | None = None
    # MB of run-folder files uploaded as artifacts at most; the files past it stay in the run
    # folder, named in the run's `nanoserve.artifacts_left_out` tag. None: every file.
    max_artifact_mb: float | None = 200.0


@dataclass
class ResultsConfig:
    """How the run folder's files are written (framework/run/report.py)."""

    # steps.csv and outputs.jsonl gzipped (.gz): auto (a run past 200,000 steps or 5 M token
    # ids, where each runs to tens of MB or more), true or false
    compress: str = "auto"


@dataclass
class ClusterConfig:
    """Replicas behind a router (`router=NAME`): docs/cluster.md."""

    replicas: int = 1  # whole engines, each with its own KV pool and policies; 1: one engine
    # local: every replica in this process, on one virtual clock (executor=simulated);
    # ray: each replica a Ray actor over the real executor, the router in this process
    backend: str = "local"
    ray_address: str | None = None  # backend=ray: null starts Ray here; auto or HOST:PORT joins
    # Prefill/decode disaggregation (executor=simulated, backend=local): each replica's role,
    # prefill | decode | mixed, one per replica; null: every replica mixed (serves requests
    # whole). Or counts: `prefill` and `decode` replicas first, the rest mixed.
    roles: list[str] | None = None
    prefill: int | None = None
    decode: int | None = None
    # The link a request's KV crosses from its prefill replica to its decode replica: a
    # shipped one (nvlink, nvlink3, nvlink_bridge, infiniband, pcie, ethernet:
    # executors/simulated/links.yaml), its figures overridden by `link_gbps` (Gbit/s, each
    # way, per GPU port: 400 for NDR InfiniBand) and `link_latency_us` (microseconds) if set.
    link: str = "nvlink"
    link_gbps: float | None = None
    link_latency_us: float | None = None
    layerwise: bool = False  # each layer's KV sent as the prefill computes the next one
    # Replica failures: a list of {replica: I, down_at_s: T, up_at_s: U} (up_at_s null or
    # left out: down for good). A failed replica loses its KV; what it held is re-routed to
    # the live replicas and computed again from the tokens delivered (docs/cluster.md).
    faults: list[Any] | None = None
    # backend=ray: how many times each replica's actor is started again after it is lost
    # (its engine empty; it rejoins the router's view once started). 0: never.
    restart_replicas: int = 0


@dataclass
class RunConfig:
    scheduler: Any = MISSING
    allocator: Any = MISSING
    preemption: Any = MISSING
    output: Any = MISSING
    router: Any = MISSING
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = MISSING
    workload: Any = MISSING
    executor: ExecutorConfig = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    window: int = 4  # output=deferred: steps of sampled tokens held on the device (0: none)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "float32"  # float32 | bfloat16 | float16
    threads: int | None = None  # torch intra-op threads; None: torch's default
    observers: list[str] = field(default_factory=lambda: ["console"])
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    print_outputs: bool = True
    # Answers printed at most (the first; the rest are in outputs.jsonl). None: all.
    print_limit: int | None = 32


def register_configs() -> None:
    """Schemas for the YAML groups, the workloads, and every registered policy."""
    from framework.plugin_host.registry import registry
    from framework.workloads.config import register_workload_configs

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=RunConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="executor", name="executor_schema", node=ExecutorConfig)
    register_workload_configs(cs)
    registry().store_configs(cs)
