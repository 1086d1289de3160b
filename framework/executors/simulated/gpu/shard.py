"""One GPU's share of a Llama-shaped model, and what each operator of a layer costs on it.

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
    gated: bool = True  # gate and up fused (Llama); False: one up projection (GPT-2, Phi)
    tp: int = 1

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


def layer_operators(shard: Shard, m: int, fits: KernelFits, dev: Device) -> dict[str, float]:
    """Seconds of each table operator of one layer at `m` tokens (attention itself, the KV
    write and the all-reduces are the step's: `framework.executors.simulated.analytic`)."""
    b, bw, h = dev.dtype_bytes, dev.bandwidth, shard.hidden
    gemm, s = fits.gemm, fits.stream
    q_dim = shard.heads * shard.head_dim

    def mm(n: int, k: int) -> float:
        return gemm.seconds(m, n, k, b, bw, dev.peak, dev.sms)

    rows = m * h * b  # one activation of the residual stream
    norm = s["norm"].seconds(2 * rows, bw)
    act_factor = 3 if shard.gated else 2  # gated reads gate and up, writes one
    return {
        "emb": s["embedding"].seconds(2 * rows, bw),
        "input_layernorm": norm,
        "attn_pre_proj": mm(shard.qkv_out, h),
        "attn_rope": s["rotary"].seconds(
            2 * m * (shard.heads_shard + shard.kv_heads_shard) * shard.head_dim * b, bw
        ),
        "attn_post_proj": mm(h, q_dim // shard.tp),
        "post_attention_layernorm": norm,
        "mlp_up_proj": mm(shard.up_out, h),
        "mlp_act": s["activation"].seconds(act_factor * m * shard.mlp_shard * b, bw),
        "mlp_down_proj": mm(h, shard.mlp_shard),
        "add": s["add"].seconds(3 * rows, bw),
    }
