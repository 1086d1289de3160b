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

The layer is Llama's (grouped-query attention, a gated MLP, rotary positions, RMSNorms) or
OPT's (multi-head attention, a ReLU MLP of two matrices, LayerNorms, biases, a learned
position table looked up and added once a step): `gpu.model_shape` reads which. A sliding
attention window (Mistral 7B) is priced over the keys each query reads: the executor hands
`StepFeatures.of` the profile's `attention_window`, so each decode row reads at most the
window's KV and a prompt's FLOPs are those of a banded causal mask. Mixture-of-experts configs
are refused: their weight traffic depends on routing, which a step's features do not carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.executors.simulated.cost import FORMAT, HostCost, ProfileError, StepCost
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.gpu.hardware import DTYPE_BYTES, HardwareSpec, section
from framework.executors.simulated.gpu.kernels import AllReduceFit
from framework.executors.simulated.gpu.model_shape import ModelShape
from framework.executors.simulated.gpu.shard import GEMM_OPERATORS, layer_operators

KIND = "analytic"
MODELS_DIR = Path(__file__).resolve().parent / "models"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

LOGIT_BYTES = 4  # logits are cast to fp32 before sampling (as vLLM and this engine do)
TENSOR_PARALLEL = (1, 2, 4, 8)

# A prompt's queries attend only to earlier keys: a causal kernel (FlashAttention) skips the
# masked half of the square, so prefill attention FLOPs are counted at half of
# queries x context. For a chunk over a cached prefix this undercounts: q queries after p
# cached keys compute q x (p + (q + 1) / 2) pairs, up to twice the count, and a step's
# features (sums over its rows) do not give the exact count of several rows. Against Vidur's
# A100 table the fitted form (`kernels.PrefillAttentionFit`) reads such chunks 0.65-1.09x
# (docs/simulator-analytic.md, "Long-prefill attention against published tables").
CAUSAL_FRACTION = 0.5


def prefill_context(f: StepFeatures) -> float:
    """The keys the longest tile of a step's prefill kernel streams, as its features give
    them: the prefill rows' context, weighted by their queries (`prefill_attn` /
    `prefill_tokens`). Exact for one row (a prompt: its length; a chunk: its prefix and
    itself); for several rows a weighted mean, below the longest row's context."""
    if f.prefill_tokens:
        return f.prefill_attn / f.prefill_tokens
    return math.sqrt(f.prefill_attn)  # features made by hand without their tokens


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
    "KV at a fraction of the bandwidth; under a sliding window, a decode row reads at most the "
    "window's KV and a prompt's FLOPs shrink by the share of the causal mask the band keeps",
    "OPT's layer: no rotary, LayerNorms priced as norms, biases read with their projections' "
    "weights, a plain MLP (up, ReLU, down), and a learned position lookup and add a step",
    "tensor parallelism: Megatron's split (heads and MLP columns, KV heads per GPU, "
    "replicated when fewer than GPUs), two all-reduces a layer of tokens x hidden, an "
    "alpha-beta fit per worker count to published all-reduce times; the logits' gather "
    "priced as an all-reduce of half their bytes",
    "sampling: fp32 logits read once per row (argmax), three more times per random row, "
    "plus a fixed cost per step (launches and the copy of the sampled ids to the host)",
    "not modelled: FP8 or quantised weights, mixture-of-experts, pipeline parallelism, "
    "speculative decoding; L2 reuse between kernels",
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
    operator, on each of `tensor_parallel` GPUs joined by `interconnect` (None: the spec's
    `default_interconnect`)."""

    hardware: HardwareSpec
    shape: ModelShape
    dtype: str
    tensor_parallel: int = 1
    interconnect: str | None = None
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
        if self.interconnect is None:
            self.interconnect = self.hardware.default_interconnect
        self.link: AllReduceFit | None = None
        if tp > 1:
            self.link = self._interconnect_for(tp)
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

    def _interconnect_for(self, tp: int) -> AllReduceFit:
        """The all-reduce fit of the named interconnect, refusing in one line a spec without
        it or a degree it does not join (a bridged pair joins two GPUs)."""
        fits, hw = self.hardware.interconnects, self.hardware
        have = ", ".join(sorted(fits)) or "none"
        if self.interconnect is None:
            raise ProfileError(
                f"executor.interconnect: unset, and {hw.id} names no default_interconnect "
                f"(it has all-reduce fits for {have})"
            )
        if self.interconnect not in fits:
            raise ProfileError(
                f"executor.interconnect={self.interconnect}: {hw.id} has all-reduce fits for {have}"
            )
        link = fits[self.interconnect]
        if tp not in link.workers:
            accepts = ", ".join(str(n) for n in (1, *link.workers))
            raise ProfileError(
                f"executor.tensor_parallel={tp}: {hw.id} over {self.interconnect} accepts {accepts}"
            )
        return link

    @property
    def attention_window(self) -> int | None:
        """The keys a query attends at most (a sliding window), or None: what the executor
        hands `StepFeatures.of` so that a row's attention is priced over what it reads."""
        return self.shape.sliding_window

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
        interconnect: str | None = None,
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
                hardware=HardwareSpec.from_dict(section(data, "hardware", "profile")),
                shape=ModelShape.from_config(section(data, "model_config", "profile")),
                dtype=dtype,
                tensor_parallel=int(parallel.get("tensor", 1)),
                interconnect=(
                    None if parallel.get("interconnect") is None else str(parallel["interconnect"])
                ),
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
        if self.shape.learned_positions:  # OPT: the position rows, looked up and added
            stream = self.hardware.kernels.stream
            ops["pos_emb"] = one["emb"] + stream["add"].seconds(
                3 * tokens * s.hidden * b, self.device.bandwidth
            )
        ops["final_norm"] = one["input_layernorm"]
        return ops

    def _dense_cost(self, tokens: int) -> tuple[float, float]:
        """(seconds, compute-bound seconds) of `dense_ops`, remembered by token count: a
        replay meets the same few hundred counts millions of times."""
        hit = self._dense.get(tokens)
        if hit is None:
            ops = self.dense_ops(tokens)
            gemm = sum(ops[op] for op in GEMM_OPERATORS)
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
        """(prefill, decode) attention seconds over all layers. Under a sliding window, `f`
        must come from `StepFeatures.of(batch, self.attention_window)`: its products and
        contexts are then the windowed ones."""
        s, dev, att = self.shard, self.device, self.hardware.attention
        L = self.shape.num_hidden_layers
        prefill = decode = 0.0
        if f.prefill_attn:
            flops = 4 * s.heads_shard * s.head_dim * CAUSAL_FRACTION * f.prefill_attn
            fit = self.hardware.kernels.prefill_attention
            prefill = L * att.prefill_seconds(flops, prefill_context(f), dev.peak, fit)
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
        ops.update(attention_prefill=prefill, attention_decode=decode, lm_head=head - gather)
        ops["all_reduce"] += gather  # the logits' gather rides on the interconnect too
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
