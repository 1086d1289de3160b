"""Analytic profiles: each step of a model on a GPU that is not at hand, priced operator by
operator from the GPU's datasheet and kernel fits (docs/simulator-analytic.md).

A step of a dense decoder runs, on each of its tensor-parallel GPUs, the embedding lookup;
per layer two RMSNorms, the fused q,k,v projection, rotary, the KV write, attention (a
prefill kernel over the prompts' queries and a decode kernel over the decode rows' context),
the o projection, the gate-up projection, SiLU-and-multiply, the down projection, two
residual adds and, under tensor parallelism, two all-reduces; then the final norm and the LM
head for the sampled rows. Each is priced by its kernel family (`gpu.kernels`) at its own
bytes and FLOPs, with efficiencies fitted to published per-operator GPU timings, so a small
GEMM is priced as a weight stream and a large one as tiles of tensor-core work. Everything it
predicts is labelled `kind: analytic` (and `meta.analytic: true`): an estimate for that GPU,
checked against published tables (`experiments.gpu_check`), not a measurement.

The model is Llama-shaped (grouped-query attention, a gated MLP). Mixture-of-experts configs
are refused: their weight traffic depends on routing, which a step's features do not carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from framework.executors.simulated.cost import FORMAT, HostCost, ProfileError, StepCost, model_id
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.gpu.kernels import AllReduceFit, AttentionFit, KernelFits
from framework.executors.simulated.gpu.shard import Device, Shard, layer_operators

KIND = "analytic"
HARDWARE_DIR = Path(__file__).resolve().parent / "hardware"
MODELS_DIR = Path(__file__).resolve().parent / "models"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

# Bytes a weight or a KV element takes in each dtype. `tfloat32` stores fp32 and multiplies
# on the TF32 tensor cores (PyTorch's `allow_tf32`); plain `float32` uses the CUDA cores.
DTYPE_BYTES = {"float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2}
LOGIT_BYTES = 4  # logits are cast to fp32 before sampling (as vLLM and this engine do)
TENSOR_PARALLEL = (1, 2, 4, 8)

# A prompt's queries attend only to earlier keys: a causal kernel (FlashAttention) skips the
# masked half of the square, so prefill attention FLOPs are counted at half of
# queries x context. For a short chunk over a long cached prefix this undercounts (by at
# most 2x, and such a chunk's attention is a small share of its step).
CAUSAL_FRACTION = 0.5

# Sampling: a greedy row reads its fp32 logits once (argmax); a random row reads them about
# three more times (temperature and softmax read and write, the multinomial draw reads).
GREEDY_PASSES = 1
RANDOM_EXTRA_PASSES = 3

# The assumptions every analytic profile states in its meta (each spec adds its own).
MODEL_ASSUMPTIONS = (
    "per operator: each kernel of the step priced by its family (GEMM: weight stream or "
    "tensor-core tiles in waves over the SMs; streaming ops: fixed cost + bytes at a fitted "
    "fraction of the bandwidth), with the fractions fitted to published per-operator GPU times",
    "a step = CUDA-graph launch + embedding + layers x (2 norms, qkv, rotary, KV write, "
    "attention, o, gate-up, activation, down, 2 residual adds, 2 all-reduces under TP) + "
    "final norm + LM head for the sampled rows; kernels run back to back (no overlap within "
    "a step), and the device runs beside the host (executor.overlap)",
    "attention: prefill FLOPs 4 x heads x head_dim x 0.5 x queries x context (causal) at a "
    "published FlashAttention fraction of the peak; decode reads each row's whole context of "
    "KV at a fraction of the bandwidth",
    "tensor parallelism: Megatron's split (heads and MLP columns, KV heads per GPU, "
    "replicated when fewer than GPUs), two all-reduces a layer of tokens x hidden, an "
    "alpha-beta fit per worker count to published all-reduce times; the logits' gather "
    "priced as an all-reduce of half their bytes",
    "sampling: fp32 logits read once per row (argmax), three more times per random row, "
    "plus a fixed cost per step (launches and the copy of the sampled ids to the host)",
    "not modelled: FP8 or quantised weights, mixture-of-experts, pipeline parallelism, "
    "speculative decoding; L2 reuse between kernels",
)


def _number(data: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    """A float field. Strings that parse as numbers are accepted because YAML 1.1 (PyYAML)
    reads `3.35e12`, without a sign in the exponent, as a string: a trap for anyone editing
    a spec by hand."""
    if key not in data:
        raise ProfileError(f"{where}.{key}: missing")
    value = data[key]
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}.{key}: not a number ({value!r})") from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ProfileError(f"{where}.{key}: must be {'> 0' if positive else '>= 0'}; got {value}")
    return number


def _section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ProfileError(f"{where}.{key}: missing or not a mapping")
    return value


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator: its datasheet peaks, its fitted kernel families, the attention
    efficiencies taken from published kernels, and the all-reduce fit of each interconnect
    it is sold in. The peaks are dense (no 2:4 sparsity: a served model's weights are not
    sparse). Each spec file says where every number comes from."""

    id: str  # the spec file's stem, e.g. h100-sxm
    name: str  # the GPU as a person names it
    memory_bandwidth: float  # bytes/s, datasheet peak
    peak_flops: dict[str, float]  # FLOP/s per dtype, dense
    sms: int  # streaming multiprocessors: how many GEMM tiles run at once
    kernels: KernelFits
    attention: AttentionFit
    step_overhead_s: float  # per step: graph launch, host-device sync
    sample_overhead_s: float  # per step that samples
    host: HostCost  # the engine's own host work (scheduler, bookkeeping)
    interconnects: dict[str, AllReduceFit] = field(default_factory=dict)
    memory_capacity: float | None = None  # bytes; informational
    sources: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "hardware") -> HardwareSpec:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: not a mapping")
        for key in ("id", "name"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ProfileError(f"{where}.{key}: missing or not a string")
        peaks_in = _section(data, "peak_flops", where)
        peaks = {str(k): _number(peaks_in, k, f"{where}.peak_flops") for k in peaks_in}
        overhead = _section(data, "overhead", where)
        sampling = data.get("sampling") or {}
        host = data.get("host") or {}
        sms = data.get("sms")
        if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
            raise ProfileError(f"{where}.sms: the GPU's streaming multiprocessors, an integer >= 1")
        links_in = data.get("interconnects") or {}
        if not isinstance(links_in, dict):
            raise ProfileError(f"{where}.interconnects: not a mapping")
        capacity = data.get("memory_capacity")

        def optional(section: dict[str, Any], key: str, name: str) -> float:
            if key not in section:
                return 0.0
            return _number(section, key, f"{where}.{name}", positive=False)

        return cls(
            id=data["id"],
            name=data["name"],
            memory_bandwidth=_number(data, "memory_bandwidth", where),
            peak_flops=peaks,
            sms=sms,
            kernels=KernelFits.from_dict(data.get("kernels"), f"{where}.kernels"),
            attention=AttentionFit.from_dict(data.get("attention"), f"{where}.attention"),
            step_overhead_s=_number(overhead, "per_step_s", f"{where}.overhead", positive=False),
            sample_overhead_s=optional(sampling, "per_step_s", "sampling"),
            host=HostCost(
                per_step_s=optional(host, "per_step_s", "host"),
                per_row_s=optional(host, "per_row_s", "host"),
            ),
            interconnects={
                str(k): AllReduceFit.from_dict(v, f"{where}.interconnects.{k}")
                for k, v in links_in.items()
            },
            memory_capacity=(None if capacity is None else _number(data, "memory_capacity", where)),
            sources=tuple(str(s) for s in data.get("sources") or ()),
            assumptions=tuple(str(s) for s in data.get("assumptions") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "memory_bandwidth": self.memory_bandwidth,
            "peak_flops": dict(self.peak_flops),
            "sms": self.sms,
            "overhead": {"per_step_s": self.step_overhead_s},
            "sampling": {"per_step_s": self.sample_overhead_s},
            "host": {"per_step_s": self.host.per_step_s, "per_row_s": self.host.per_row_s},
            "attention": self.attention.to_dict(),
            "kernels": self.kernels.to_dict(),
            "interconnects": {k: v.to_dict() for k, v in self.interconnects.items()},
        }
        if self.memory_capacity is not None:
            out["memory_capacity"] = self.memory_capacity
        out["sources"] = list(self.sources)
        out["assumptions"] = list(self.assumptions)
        return out

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ProfileError(
                f"hardware {self.id}: no peak_flops for dtype {dtype} "
                f"(has {', '.join(sorted(self.peak_flops))})"
            )
        return self.peak_flops[dtype]

    def device(self, dtype: str) -> Device:
        return Device(self.memory_bandwidth, self.peak(dtype), self.sms, DTYPE_BYTES[dtype])


# The config fields the model needs, with Hugging Face's defaults where it has one.
CONFIG_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
)


@dataclass(frozen=True)
class ModelShape:
    """A Llama-shaped model's sizes, read from its Hugging Face config (a dict)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    model_type: str = "llama"

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "model_config") -> ModelShape:
        if not isinstance(config, dict):
            raise ProfileError(f"{where}: not a mapping")
        for moe in ("num_local_experts", "num_experts", "n_routed_experts"):
            if config.get(moe):
                raise ProfileError(
                    f"{where}.{moe}: a mixture-of-experts model; the analytic profile covers "
                    "dense Llama-shaped models only"
                )

        def size(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if value is None:
                raise ProfileError(f"{where}.{key}: missing")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProfileError(f"{where}.{key}: must be a positive integer; got {value!r}")
            return value

        heads = size("num_attention_heads")
        hidden = size("hidden_size")
        if config.get("head_dim") is None and hidden % heads:
            raise ProfileError(f"{where}.head_dim: missing, and hidden_size % heads != 0")
        kv = size("num_key_value_heads", heads)
        if heads % kv:
            raise ProfileError(f"{where}.num_key_value_heads: {kv} does not divide {heads} heads")
        return cls(
            hidden_size=hidden,
            intermediate_size=size("intermediate_size"),
            num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=size("head_dim", hidden // heads),
            vocab_size=size("vocab_size"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            architectures=tuple(config.get("architectures") or ("LlamaForCausalLM",)),
            model_type=str(config.get("model_type") or "llama"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
        }

    @property
    def model_id(self) -> str:
        """`cost.model_id` of this shape, the same string a loaded config gives."""
        return model_id(SimpleNamespace(**self.to_dict()))

    # Parameter counts (elements, not bytes).
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer (k and v are narrower under GQA)."""
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        bias = (self.q_dim + 2 * self.kv_dim + h) if self.attention_bias else 0
        return weights + bias

    @property
    def mlp_params(self) -> int:
        """gate, up and down projections of one layer."""
        h, i = self.hidden_size, self.intermediate_size
        return 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden_size  # two RMSNorms

    @property
    def block_params(self) -> int:
        """Everything but the embedding and the output head: the layers and the final norm.
        The `2 x params x tokens` FLOPs are over these."""
        return self.num_hidden_layers * self.layer_params + self.hidden_size

    @property
    def total_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.embedding_params + self.block_params + head

    @property
    def kv_elements_per_token(self) -> int:
        return self.num_hidden_layers * 2 * self.kv_dim

    def shard(self, tp: int = 1) -> Shard:
        """One of `tp` GPUs' share (Megatron's split)."""
        return Shard(
            hidden=self.hidden_size,
            intermediate=self.intermediate_size,
            heads=self.num_attention_heads,
            kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab=self.vocab_size,
            gated=True,
            tp=tp,
        )


@dataclass(frozen=True)
class StepEstimate:
    """One step's seconds on one GPU, by operator (summed over the layers), and why."""

    ops: dict[str, float]  # seconds per operator for the whole step
    compute_s: float  # of forward_s, the seconds of compute-bound kernels
    forward_s: float
    sample_s: float

    @property
    def bound(self) -> str:
        return "compute" if 2 * self.compute_s > self.forward_s else "memory"


@dataclass
class AnalyticProfile:
    """A `CostModel` that prices each step on `hardware` for `shape` in `dtype`, operator by
    operator, on each of `tensor_parallel` GPUs joined by `interconnect`."""

    hardware: HardwareSpec
    shape: ModelShape
    dtype: str
    tensor_parallel: int = 1
    interconnect: str = "dgx"
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = KIND
    host: HostCost = field(init=False)  # the spec's: the CostModel protocol reads it here

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ProfileError(
                f"dtype: {self.dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}"
            )
        self.device = self.hardware.device(self.dtype)  # refuses a dtype with no peak
        tp = self.tensor_parallel
        if tp not in TENSOR_PARALLEL:
            raise ProfileError(
                f"executor.tensor_parallel must be one of {', '.join(map(str, TENSOR_PARALLEL))}; "
                f"got {tp}"
            )
        try:
            self.shard = self.shape.shard(tp)
        except ValueError as exc:
            raise ProfileError(str(exc)) from None
        self.link: AllReduceFit | None = None
        if tp > 1:
            links = self.hardware.interconnects
            if self.interconnect not in links:
                have = ", ".join(sorted(links)) or "none"
                raise ProfileError(
                    f"executor.interconnect={self.interconnect}: {self.hardware.id} has "
                    f"all-reduce fits for {have}"
                )
            self.link = links[self.interconnect]
            self.link.seconds(1.0, tp)  # refuses a worker count the fit has no times for
        self.host = self.hardware.host
        base = self.base_meta()
        for key in ("model_id", "dtype", "tensor_parallel"):
            if key in self.meta and self.meta[key] != base[key]:
                raise ProfileError(
                    f"meta.{key}: {self.meta[key]} does not match the profile's {base[key]}"
                )
        self.meta = {**base, **self.meta, "analytic": True}
        self._dense: dict[int, tuple[float, float]] = {}
        self._head: dict[int, tuple[float, float]] = {}

    def base_meta(self) -> dict[str, Any]:
        """What the profile's own fields say about it: enough to label any result."""
        return {
            "model_id": self.shape.model_id,
            "dtype": self.dtype,
            "device": self.hardware.name,
            "hardware": self.hardware.id,
            "tensor_parallel": self.tensor_parallel,
            "interconnect": self.interconnect if self.tensor_parallel > 1 else None,
            "cost_model": "per-operator",
            "analytic": True,
            "assumptions": list(MODEL_ASSUMPTIONS) + list(self.hardware.assumptions),
            "sources": list(self.hardware.sources),
        }

    @classmethod
    def build(
        cls,
        hardware_spec: dict[str, Any],
        model_config: dict[str, Any],
        dtype: str,
        meta: dict[str, Any] | None = None,
        tensor_parallel: int = 1,
        interconnect: str = "dgx",
    ) -> AnalyticProfile:
        """From a spec file's contents and a Hugging Face config dict (`config.to_dict()` or
        a config.json read as JSON)."""
        return cls(
            hardware=HardwareSpec.from_dict(hardware_spec),
            shape=ModelShape.from_config(model_config),
            dtype=dtype,
            tensor_parallel=tensor_parallel,
            interconnect=interconnect,
            meta=dict(meta or {}),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> AnalyticProfile:
        """From a profile file's contents (`cost.read_profile`); `source` is its path, kept in
        `meta.source` so that every result can name the file it was predicted from."""
        where = f"executor.profile={source}" if source else "profile"
        if data.get("kind") != KIND:
            raise ProfileError(f"{where}: kind must be {KIND}; got {data.get('kind')!r}")
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise ProfileError(f"{where}: meta is not a mapping")
        dtype = data.get("dtype", meta.get("dtype"))
        if not isinstance(dtype, str):
            raise ProfileError(f"{where}: dtype missing")
        parallel = data.get("parallel") or {}
        try:
            profile = cls(
                hardware=HardwareSpec.from_dict(_section(data, "hardware", "profile")),
                shape=ModelShape.from_config(_section(data, "model_config", "profile")),
                dtype=dtype,
                tensor_parallel=int(parallel.get("tensor", 1)),
                interconnect=str(parallel.get("interconnect", "dgx")),
                meta={k: v for k, v in meta.items() if k != "source"},
            )
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc.message}") from None
        if source:
            profile.meta["source"] = source
        return profile

    def to_dict(self) -> dict[str, Any]:
        """The profile file's contents (what `from_dict` reads back)."""
        return {
            "format": FORMAT,
            "kind": self.kind,
            "meta": {k: v for k, v in self.meta.items() if k != "source"},
            "dtype": self.dtype,
            "parallel": {"tensor": self.tensor_parallel, "interconnect": self.interconnect},
            "hardware": self.hardware.to_dict(),
            "model_config": self.shape.to_dict(),
        }

    # The model.
    def all_reduce_s(self, nbytes: float) -> float:
        return self.link.seconds(nbytes, self.tensor_parallel) if self.link else 0.0

    def dense_ops(self, tokens: int) -> dict[str, float]:
        """The step's seconds by operator that depend on its token count alone: the layers'
        projections and streaming ops, their all-reduces, the embedding and the final norm."""
        s, L = self.shard, self.shape.num_hidden_layers
        one = layer_operators(s, tokens, self.hardware.kernels, self.device)
        b = self.device.dtype_bytes
        kv_write = self.hardware.kernels.stream["add"].seconds(
            2 * tokens * s.kv_bytes_per_token_layer(b), self.device.bandwidth
        )
        ops = {op: L * t for op, t in one.items() if op != "emb"}
        ops["add"] *= 2  # two residual adds a layer; the table times one
        ops["kv_write"] = L * kv_write
        ops["all_reduce"] = L * 2 * self.all_reduce_s(tokens * s.hidden * b)
        ops["emb"] = one["emb"]
        ops["final_norm"] = one["input_layernorm"]
        return ops

    def _dense_cost(self, tokens: int) -> tuple[float, float]:
        """(seconds, compute-bound seconds) of `dense_ops`, remembered by token count: a
        replay meets the same few hundred counts millions of times."""
        hit = self._dense.get(tokens)
        if hit is None:
            ops = self.dense_ops(tokens)
            gemm = sum(ops[op] for op in ("attn_pre_proj", "attn_post_proj",
                                          "mlp_up_proj", "mlp_down_proj"))  # fmt: skip
            hit = self._dense[tokens] = (
                sum(ops.values()),
                gemm if self._compute_bound(tokens) else 0.0,
            )
        return hit

    def _compute_bound(self, m: int) -> bool:
        """Whether a GEMM of `m` rows through the gate-up weights is past the ridge."""
        s, dev = self.shard, self.device
        k, n, b = s.hidden, s.up_out, dev.dtype_bytes
        memory = b * (m * k + k * n + m * n) / dev.bandwidth
        return 2 * m * n * k / dev.peak > memory

    def _head_cost(self, rows: int) -> tuple[float, float]:
        """(seconds, of them the logits' gather) of the LM head over the sampled rows."""
        hit = self._head.get(rows)
        if hit is None:
            s, dev = self.shard, self.device
            vocab_shard = math.ceil(s.vocab / self.tensor_parallel)
            head = self.hardware.kernels.gemm.seconds(
                rows, vocab_shard, s.hidden, dev.dtype_bytes, dev.bandwidth, dev.peak, dev.sms
            )
            gather = self.all_reduce_s(rows * s.vocab * dev.dtype_bytes / 2)
            hit = self._head[rows] = (head + gather, gather)
        return hit

    def attention_s(self, f: StepFeatures) -> tuple[float, float]:
        """(prefill, decode) attention seconds over all layers."""
        s, dev, att = self.shard, self.device, self.hardware.attention
        L = self.shape.num_hidden_layers
        prefill = decode = 0.0
        if f.prefill_attn:
            flops = 4 * s.heads_shard * s.head_dim * CAUSAL_FRACTION * f.prefill_attn
            prefill = L * (att.fixed_s + flops / (dev.peak * att.prefill))
        if f.decode_ctx:
            nbytes = f.decode_ctx * s.kv_bytes_per_token_layer(dev.dtype_bytes)
            decode = L * (att.fixed_s + nbytes / (dev.bandwidth * att.decode))
        return prefill, decode

    def sample_s(self, f: StepFeatures) -> float:
        if not f.rows:
            return 0.0
        passes = GREEDY_PASSES * f.rows + RANDOM_EXTRA_PASSES * f.random_rows
        stream = self.hardware.kernels.stream["add"]
        return self.hardware.sample_overhead_s + stream.seconds(
            LOGIT_BYTES * self.shape.vocab_size * passes, self.device.bandwidth
        )

    def estimate(self, f: StepFeatures) -> StepEstimate:
        """The step's seconds by operator (see the module docstring and MODEL_ASSUMPTIONS)."""
        if f.rows == 0 and f.num_tokens == 0:
            return StepEstimate({}, 0.0, 0.0, 0.0)
        ops = self.dense_ops(f.num_tokens)
        prefill, decode = self.attention_s(f)
        head, gather = self._head_cost(f.rows)
        ops.update(attention_prefill=prefill, attention_decode=decode,
                   lm_head=head - gather, logits_gather=gather)  # fmt: skip
        ops["all_reduce"] += gather
        del ops["logits_gather"]
        _, compute = self._dense_cost(f.num_tokens)
        forward = self.hardware.step_overhead_s + sum(ops.values())
        return StepEstimate(ops, compute + prefill, forward, self.sample_s(f))

    def predict(self, features: StepFeatures) -> StepCost:
        f = features
        if f.rows == 0 and f.num_tokens == 0:
            return StepCost(0.0, 0.0, 0.0)
        dense, compute = self._dense_cost(f.num_tokens)
        prefill, decode = self.attention_s(f)
        head, _ = self._head_cost(f.rows)
        forward = self.hardware.step_overhead_s + dense + prefill + decode + head
        return StepCost(forward_s=forward, sample_s=self.sample_s(f), compute_s=compute + prefill)


def hardware_spec_path(name: str | Path) -> Path:
    """A shipped spec by its stem (`h100-sxm`), or any spec file by path."""
    p = Path(name).expanduser()
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.is_file():
            raise ProfileError(f"hardware spec {name}: no such file")
        return p
    shipped = HARDWARE_DIR / f"{name}.yaml"
    if not shipped.is_file():
        known = ", ".join(sorted(q.stem for q in HARDWARE_DIR.glob("*.yaml")))
        raise ProfileError(f"hardware spec {name}: not shipped (shipped: {known}), nor a file")
    return shipped


def load_hardware_spec(name: str | Path) -> dict[str, Any]:
    """A spec file's contents, checked (`HardwareSpec.from_dict`), its `id` defaulting to
    the file's stem."""
    import json

    import yaml

    p = hardware_spec_path(name)
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ProfileError(f"hardware spec {p}: not readable ({exc})") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"hardware spec {p}: not a mapping")
    data.setdefault("id", p.stem)
    HardwareSpec.from_dict(data, where=f"hardware spec {p}")
    return data
