"""Analytic profiles: a roofline estimate of each step from a hardware spec and a model's
config, for hardware that is not at hand (docs/simulator-analytic.md).

A step of a dense decoder streams its weights once, reads the KV cache its rows attend over,
and does about 2 FLOPs per weight per token. Its time is taken as a fixed overhead plus the
larger of the memory time and the compute time, each at an achievable fraction of the
datasheet peak:

    forward_s = overhead + max(bytes / (bandwidth x bw_eff), flops / (peak[dtype] x mfu))

That is all it knows: no kernel choice, no L2 cache, no overlap between steps, no tensor
parallelism. It is right about which resource bounds a step and roughly how long a step of
that shape takes; it is not a measurement, so everything it predicts is labelled
`kind: analytic` (and `meta.analytic: true`).

The model is Llama-shaped: embeddings, per layer q/k/v/o projections with grouped-query
attention and a gated MLP (gate, up, down), two RMSNorms per layer, a final norm and an
output head (the embedding itself when tied). Mixture-of-experts configs are refused: their
weight traffic depends on routing, which a step's features do not carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from framework.executors.simulated.cost import FORMAT, HostCost, ProfileError, StepCost, model_id
from framework.executors.simulated.features import StepFeatures

KIND = "analytic"
HARDWARE_DIR = Path(__file__).resolve().parent / "hardware"
MODELS_DIR = Path(__file__).resolve().parent / "models"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

# Bytes a weight or a KV element takes in each dtype. `tfloat32` stores fp32 and multiplies
# on the TF32 tensor cores (PyTorch's `allow_tf32`); plain `float32` uses the CUDA cores.
DTYPE_BYTES = {"float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2}
LOGIT_BYTES = 4  # logits are cast to fp32 before sampling (as vLLM and this engine do)

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
    "step time = overhead + max(bytes / (bandwidth x bandwidth_efficiency), "
    "flops / (peak_flops[dtype] x compute_efficiency)): one roofline per step, no overlap "
    "between steps, no L2 cache reuse, one GPU (no tensor parallelism)",
    "weights: every parameter but the input embedding is read once per step (the embedding "
    "lookup reads one row per token); parameter count of a Llama-shaped model from its config",
    "FLOPs: 2 x transformer-block parameters x tokens; output head 2 x hidden x vocab for "
    "the sampled rows only (one per row); attention 4 x layers x heads x head_dim x "
    "(decode context + 0.5 x prefill queries x context; the 0.5 is causal masking)",
    "KV cache: layers x 2 x kv_heads x head_dim x dtype bytes per token; decode rows read "
    "their whole context, prefill rows read their context once, every query token's K and V "
    "are written once",
    "activations: each matmul's input and output and the attention's q and output go to "
    "memory once per token per layer (norms, activation and residual adds fused)",
    "sampling: fp32 logits read once per row (argmax), three more times per random row, at "
    "the effective bandwidth, plus a fixed cost per step (launches and the copy of the "
    "sampled ids to the host)",
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
    """One accelerator as its datasheet and a few stated assumptions describe it.

    The peaks are dense (no 2:4 sparsity: a served model's weights are not sparse). The
    efficiencies and overheads are assumptions, not datasheet numbers; each spec file says
    where they come from.
    """

    id: str  # the spec file's stem, e.g. h100-sxm
    name: str  # the GPU as a person names it
    memory_bandwidth: float  # bytes/s, datasheet peak
    peak_flops: dict[str, float]  # FLOP/s per dtype, dense
    bandwidth_efficiency: float  # achievable fraction of memory_bandwidth
    compute_efficiency: float  # achievable fraction of peak_flops (MFU of a large GEMM)
    step_overhead_s: float  # per step: graph launch, host-device sync
    layer_overhead_s: float  # per layer per step: kernel launches and tails
    sample_overhead_s: float  # per step that samples
    host: HostCost  # the engine's own host work (scheduler, bookkeeping)
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
        eff = _section(data, "efficiency", where)
        overhead = _section(data, "overhead", where)
        sampling = data.get("sampling") or {}
        host = data.get("host") or {}
        bw_eff = _number(eff, "bandwidth", f"{where}.efficiency")
        mfu = _number(eff, "compute", f"{where}.efficiency")
        for key, value in (("bandwidth", bw_eff), ("compute", mfu)):
            if value > 1:
                raise ProfileError(f"{where}.efficiency.{key}: a fraction of peak, <= 1")
        capacity = data.get("memory_capacity")
        return cls(
            id=data["id"],
            name=data["name"],
            memory_bandwidth=_number(data, "memory_bandwidth", where),
            peak_flops=peaks,
            bandwidth_efficiency=bw_eff,
            compute_efficiency=mfu,
            step_overhead_s=_number(overhead, "per_step_s", f"{where}.overhead", positive=False),
            layer_overhead_s=_number(overhead, "per_layer_s", f"{where}.overhead", positive=False),
            sample_overhead_s=(
                _number(sampling, "per_step_s", f"{where}.sampling", positive=False)
                if "per_step_s" in sampling
                else 0.0
            ),
            host=HostCost(
                per_step_s=(
                    _number(host, "per_step_s", f"{where}.host", positive=False)
                    if "per_step_s" in host
                    else 0.0
                ),
                per_row_s=(
                    _number(host, "per_row_s", f"{where}.host", positive=False)
                    if "per_row_s" in host
                    else 0.0
                ),
            ),
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
            "efficiency": {
                "bandwidth": self.bandwidth_efficiency,
                "compute": self.compute_efficiency,
            },
            "overhead": {"per_step_s": self.step_overhead_s, "per_layer_s": self.layer_overhead_s},
            "sampling": {"per_step_s": self.sample_overhead_s},
            "host": {"per_step_s": self.host.per_step_s, "per_row_s": self.host.per_row_s},
        }
        if self.memory_capacity is not None:
            out["memory_capacity"] = self.memory_capacity
        out["sources"] = list(self.sources)
        out["assumptions"] = list(self.assumptions)
        return out

    @property
    def effective_bandwidth(self) -> float:
        return self.memory_bandwidth * self.bandwidth_efficiency

    def effective_flops(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ProfileError(
                f"hardware {self.id}: no peak_flops for dtype {dtype} "
                f"(has {', '.join(sorted(self.peak_flops))})"
            )
        return self.peak_flops[dtype] * self.compute_efficiency


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
    def weight_params_read(self) -> int:
        """The parameters a step streams whole: the blocks and the output head (the input
        embedding is only looked up, one row per token, unless it is the head)."""
        return self.block_params + self.embedding_params

    @property
    def kv_elements_per_token(self) -> int:
        return self.num_hidden_layers * 2 * self.kv_dim

    @property
    def activation_elements_per_token(self) -> int:
        """Per token, all layers: each matmul's input and output (qkv, o, gate-up, down) and
        the attention's q and output, once each."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim
        qkv = h + q + 2 * kv
        attn = 2 * q
        o = q + h
        gate_up = h + 2 * i
        down = i + h
        return self.num_hidden_layers * (qkv + attn + o + gate_up + down)


@dataclass(frozen=True)
class StepEstimate:
    """One step's roofline terms: what `predict` takes the max of, and why."""

    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    activation_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    overhead_s: float
    forward_s: float
    sample_s: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


@dataclass
class AnalyticProfile:
    """A `CostModel` that predicts each step from the roofline of `hardware` for `shape`
    in `dtype`."""

    hardware: HardwareSpec
    shape: ModelShape
    dtype: str
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = KIND
    host: HostCost = field(init=False)  # the spec's: the CostModel protocol reads it here

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ProfileError(
                f"dtype: {self.dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}"
            )
        self.hardware.effective_flops(self.dtype)  # refuses a dtype the spec has no peak for
        self.host = self.hardware.host
        base = self.base_meta()
        if "model_id" in self.meta and self.meta["model_id"] != base["model_id"]:
            raise ProfileError(
                f"meta.model_id: {self.meta['model_id']} does not match model_config "
                f"({base['model_id']})"
            )
        if "dtype" in self.meta and self.meta["dtype"] != self.dtype:
            raise ProfileError(
                f"meta.dtype: {self.meta['dtype']} does not match dtype {self.dtype}"
            )
        self.meta = {**base, **self.meta, "analytic": True}

    def base_meta(self) -> dict[str, Any]:
        """What the profile's own fields say about it: enough to label any result."""
        return {
            "model_id": self.shape.model_id,
            "dtype": self.dtype,
            "device": self.hardware.name,
            "hardware": self.hardware.id,
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
    ) -> AnalyticProfile:
        """From a spec file's contents and a Hugging Face config dict (`config.to_dict()` or
        a config.json read as JSON)."""
        return cls(
            hardware=HardwareSpec.from_dict(hardware_spec),
            shape=ModelShape.from_config(model_config),
            dtype=dtype,
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
        try:
            profile = cls(
                hardware=HardwareSpec.from_dict(_section(data, "hardware", "profile")),
                shape=ModelShape.from_config(_section(data, "model_config", "profile")),
                dtype=dtype,
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
            "hardware": self.hardware.to_dict(),
            "model_config": self.shape.to_dict(),
        }

    # The model.
    def estimate(self, f: StepFeatures) -> StepEstimate:
        """The roofline terms of one step (see the module docstring and MODEL_ASSUMPTIONS)."""
        if f.rows == 0 and f.num_tokens == 0:
            return StepEstimate(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        s, hw = self.shape, self.hardware
        b = DTYPE_BYTES[self.dtype]
        tokens = f.num_tokens
        weights = b * (s.weight_params_read + tokens * s.hidden_size)
        # Each prefill row reads its context once. The features carry the sum of
        # queries x context, not of context; for rows of equal query length (and for one
        # prompt) attn x rows / tokens is that sum exactly.
        prefill_ctx = f.prefill_attn * f.prefill_rows / f.prefill_tokens if f.prefill_tokens else 0
        kv_token = b * s.kv_elements_per_token
        kv_read = kv_token * (f.decode_ctx + prefill_ctx)
        kv_write = kv_token * tokens
        activations = b * s.activation_elements_per_token * tokens
        attn_pairs = f.decode_ctx + CAUSAL_FRACTION * f.prefill_attn
        flops = (
            2 * s.block_params * tokens
            + 2 * s.hidden_size * s.vocab_size * f.rows
            + 4 * s.num_hidden_layers * s.q_dim * attn_pairs
        )
        memory_s = (weights + kv_read + kv_write + activations) / hw.effective_bandwidth
        compute_s = flops / hw.effective_flops(self.dtype)
        overhead = hw.step_overhead_s + hw.layer_overhead_s * s.num_hidden_layers
        logit_reads = (
            LOGIT_BYTES
            * s.vocab_size
            * (GREEDY_PASSES * f.rows + RANDOM_EXTRA_PASSES * f.random_rows)
        )
        sample = (hw.sample_overhead_s + logit_reads / hw.effective_bandwidth) if f.rows else 0.0
        return StepEstimate(
            weight_bytes=weights,
            kv_read_bytes=kv_read,
            kv_write_bytes=kv_write,
            activation_bytes=activations,
            flops=flops,
            memory_s=memory_s,
            compute_s=compute_s,
            overhead_s=overhead,
            forward_s=overhead + max(memory_s, compute_s),
            sample_s=sample,
        )

    def predict(self, features: StepFeatures) -> StepCost:
        e = self.estimate(features)
        # A compute-bound step's roofline term is its FLOPs' time; a memory-bound one's is
        # all bandwidth (`executor.compute_speed` then leaves it alone).
        compute = e.compute_s if e.compute_s > e.memory_s else 0.0
        return StepCost(forward_s=e.forward_s, sample_s=e.sample_s, compute_s=compute)


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
