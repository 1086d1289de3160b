"""One GPU's share of a dense decoder, and what each operator of a layer costs on it.

Tensor parallelism is Megatron's: the fused q,k,v projection and the gate-up projection are
split by columns (heads and MLP columns), the o and down projections by rows, so each GPU
holds 1/N of every weight matrix and of the KV heads (a KV head is replicated when there are
fewer KV heads than GPUs, as vLLM does), and the two row-parallel outputs are summed by one
all-reduce each. Norms, residual adds and the embedding lookup run whole on every GPU.

The operator names are those of the published per-operator tables (Vidur's `*.mlp.csv`), so
that `experiments.gpu_check` sets a row of such a table against `layer_operators` directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from framework.executors.simulated.gpu.kernels import KernelFits

# The operators of one layer, as the published tables name them.
TABLE_OPERATORS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
GEMM_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


@dataclass(frozen=True)
class Device:
    """What the kernel formulas need of a GPU in one dtype."""

    bandwidth: float  # bytes/s, datasheet peak
    peak: float  # FLOP/s, dense, in the run's dtype
    sms: int  # streaming multiprocessors
    dtype_bytes: int


@dataclass(frozen=True)
class Shard:
    """The sizes one of `tp` GPUs holds."""

    hidden: int
    intermediate: int  # the whole model's MLP width
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    gated: bool = True  # gate and up fused (Llama); False: one up projection (OPT, Phi)
    tp: int = 1
    rotary: bool = True  # False: learned positions (OPT), added once before the layers
    attention_bias: bool = False  # q, k, v and o carry a bias (OPT)
    mlp_bias: bool = False  # the MLP's projections carry a bias (OPT)

    def __post_init__(self) -> None:
        if self.tp < 1 or self.heads % self.tp:
            raise ValueError(
                f"executor.tensor_parallel={self.tp} must divide the model's {self.heads} "
                "attention heads"
            )
        if self.intermediate % self.tp:
            raise ValueError(
                f"executor.tensor_parallel={self.tp} must divide the MLP width {self.intermediate}"
            )

    @property
    def heads_shard(self) -> int:
        return self.heads // self.tp

    @property
    def kv_heads_shard(self) -> int:
        """KV heads on one GPU: split when there are at least as many as GPUs, else one
        replicated head per GPU."""
        return max(1, math.ceil(self.kv_heads / self.tp))

    @property
    def mlp_shard(self) -> int:
        return self.intermediate // self.tp

    @property
    def qkv_out(self) -> int:
        return (self.heads_shard + 2 * self.kv_heads_shard) * self.head_dim

    @property
    def up_out(self) -> int:
        return self.mlp_shard * (2 if self.gated else 1)

    def kv_bytes_per_token_layer(self, b: int) -> int:
        """One layer's K and V for one token on one GPU."""
        return 2 * self.kv_heads_shard * self.head_dim * b


@dataclass(frozen=True)
class Gemm:
    """A projection of the step's tokens: k inputs to n outputs, with a bias or not (added in
    the GEMM's epilogue, as cuBLASLt's bias epilogue and vLLM's linear layers do)."""

    n: int
    k: int
    bias: bool = False


@dataclass(frozen=True)
class Stream:
    """A streaming op of a kernel family, and the bytes it reads and writes."""

    family: str
    nbytes: float


def layer_shapes(shard: Shard, m: int, b: int) -> dict[str, Gemm | Stream]:
    """What each table operator of one layer does at `m` tokens in `b` bytes an element: the
    one place the operators' shapes are written, for pricing and for fitting alike."""
    h = shard.hidden
    rows = m * h * b  # one activation of the residual stream
    gated = 3 if shard.gated else 2  # gated reads gate and up, writes one
    qk_heads = shard.heads_shard + shard.kv_heads_shard
    rope = 2 * m * qk_heads * shard.head_dim * b if shard.rotary else 0  # 0: no kernel
    attn_bias, mlp_bias = shard.attention_bias, shard.mlp_bias
    return {
        "emb": Stream("embedding", 2 * rows),
        "input_layernorm": Stream("norm", 2 * rows),
        "attn_pre_proj": Gemm(shard.qkv_out, h, attn_bias),
        "attn_rope": Stream("rotary", rope),
        "attn_post_proj": Gemm(h, shard.heads_shard * shard.head_dim, attn_bias),
        "post_attention_layernorm": Stream("norm", 2 * rows),
        "mlp_up_proj": Gemm(shard.up_out, h, mlp_bias),
        "mlp_act": Stream("activation", gated * m * shard.mlp_shard * b),
        "mlp_down_proj": Gemm(h, shard.mlp_shard, mlp_bias),
        "add": Stream("add", 3 * rows),
    }


def layer_operators(shard: Shard, m: int, fits: KernelFits, dev: Device) -> dict[str, float]:
    """Seconds of each table operator of one layer at `m` tokens (attention itself, the KV
    write and the all-reduces are the step's: `framework.executors.simulated.analytic`)."""
    b, bw = dev.dtype_bytes, dev.bandwidth
    out = {}
    for op, shape in layer_shapes(shard, m, b).items():
        if isinstance(shape, Gemm):
            out[op] = fits.gemm.seconds(m, shape.n, shape.k, b, bw, dev.peak, dev.sms, shape.bias)
        else:
            out[op] = fits.stream[shape.family].seconds(shape.nbytes, bw)
    return out
