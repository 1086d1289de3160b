"""Time one transformer layer's operators on this GPU, in the published tables' format:
`python -m experiments.op_table --out DIR [--device cuda] [--dtype float16] [--quick]`.

It writes `DIR/<gpu>_<model>.mlp.csv` for each model shape below (Vidur's `*.mlp.csv`
columns, so `python -m experiments.gpu_check FILE --hardware NAME` judges the cost model on
it exactly as on the published tables), and `DIR/<gpu>_attention.csv` (prefill and decode
attention at a few shapes, for the attention family that no published table checks).

How each operator is timed, and why:
- Each operator is captured R times into one CUDA graph and the graph is replayed; the time is
  the median replay over R. A graph has no Python launch gaps, as vLLM's decode graphs have
  none, so a 3 µs kernel is not timed as the host's 10 µs launch.
- A GEMM cycles through copies of its weight matrix that add up to at least 256 MB (over four
  times an H100's or H200's 50-60 MB L2), so every replay reads its weights from HBM, as a
  forward pass over different layers does. Activations are not cycled: in a forward pass they
  come from the kernel before, often out of L2.
- The operators are PyTorch's: `F.linear` (cuBLAS) for the four projections, `F.rms_norm`,
  `F.embedding` on one GPU's vocabulary shard, and the residual add. Rotary and SiLU-and-
  multiply are left out: eager PyTorch runs each as several kernels where a serving engine
  runs one fused kernel, so their time would judge PyTorch's kernel count, not the model.
- Each shard is one GPU's share under Megatron tensor parallelism (`Shard` in
  `framework.executors.simulated.gpu.shard`), so a TP row needs one GPU only.

Runs with torch alone (no Hydra): the device machine has CUDA torch. `--device cpu --quick`
dry-runs it here.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from framework.executors.simulated.gpu.shard import Shard


@dataclass(frozen=True)
class Model:
    name: str
    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    vocab: int
    gated: bool = True


# The shapes of Vidur's published tables (their own `n_*` columns), so a measured table here
# sits beside a published one of the same shape.
MODELS = (
    Model("Llama-2-7b-hf", 32, 32, 4096, 11008, 32768),
    Model("Meta-Llama-3-8B", 32, 8, 4096, 14336, 128256),
    Model("phi-2", 32, 32, 2560, 10240, 51200, gated=False),
    Model("internlm-20b", 40, 40, 5120, 13824, 103168),
    Model("CodeLlama-34b-Instruct-hf", 64, 8, 8192, 22016, 32768),
    Model("Llama-2-70b-hf", 64, 8, 8192, 28672, 32768),
    Model("Qwen-72B", 64, 64, 8192, 24576, 152064),
)
TOKENS = (
    1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512,
    640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096,
)  # fmt: skip
QUICK_TOKENS = (1, 16, 128, 512)
TP = (1, 2, 4, 8)
OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_down_proj",
    "add",
)
SHAPE_COLUMNS = (
    "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
    "num_tokens", "num_tensor_parallel_workers",
)  # fmt: skip
STATS = ("min", "max", "mean", "median", "std")
WEIGHT_SPAN = 256 * 2**20  # bytes of weight copies a GEMM cycles through


class Timer:
    """Median seconds of one call of `fn(i)`, from CUDA-graph replays (on CUDA) or wall
    time (on a CPU dry run)."""

    def __init__(self, device: torch.device, replays: int) -> None:
        self.device = device
        self.replays = replays

    def __call__(self, fn, reps: int) -> list[float]:
        if self.device.type != "cuda":  # a dry run: the reps are sized for a GPU
            reps = 1
            out = []
            for _ in range(self.replays):
                t0 = time.perf_counter()
                for i in range(reps):
                    fn(i)
                out.append((time.perf_counter() - t0) / reps)
            return out
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(reps):
                fn(i)
        graph.replay()
        torch.cuda.synchronize()
        out = []
        for _ in range(self.replays):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e-3 / reps)
        del graph
        return out


def reps_for(seconds: float) -> int:
    """Calls per graph: about 2 ms of work, 3 to 64 calls."""
    return max(3, min(64, int(2e-3 / max(seconds, 1e-7))))


def rough(nbytes: float, flops: float) -> float:
    """A rough guess of an op's seconds on a current GPU, only to size a graph."""
    return 4e-6 + nbytes / 3e12 + flops / 6e14


def gemm_op(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device):
    b = torch.finfo(dtype).bits // 8
    copies = max(1, math.ceil(WEIGHT_SPAN / (n * k * b))) if device.type == "cuda" else 1
    weights = [torch.randn(n, k, dtype=dtype, device=device) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, dtype=dtype, device=device)
    out = torch.empty(m, n, dtype=dtype, device=device)

    def fn(i: int) -> None:
        torch.matmul(x, weights[i % copies].t(), out=out)

    return fn, rough(b * (m * k + n * k + m * n), 2.0 * m * n * k)


def layer_ops(s: Shard, m: int, dtype: torch.dtype, device: torch.device) -> dict:
    b = torch.finfo(dtype).bits // 8
    h = s.hidden
    x = torch.randn(m, h, dtype=dtype, device=device)
    gamma = torch.ones(h, dtype=dtype, device=device)
    table = torch.randn(s.vocab // s.tp, h, dtype=dtype, device=device)
    ids = torch.randint(0, s.vocab // s.tp, (m,), device=device)
    residual = torch.randn_like(x)
    stream = rough(2 * m * h * b, 0)

    def emb(_: int) -> torch.Tensor:
        return F.embedding(ids, table)

    def norm(_: int) -> torch.Tensor:
        return F.rms_norm(x, (h,), gamma, 1e-5)

    def add(_: int) -> torch.Tensor:
        return x + residual

    ops = {
        "emb": (emb, stream),
        "input_layernorm": (norm, stream),
        "attn_pre_proj": gemm_op(m, s.qkv_out, h, dtype, device),
        "attn_post_proj": gemm_op(m, h, s.heads_shard * s.head_dim, dtype, device),
        "post_attention_layernorm": (norm, stream),
        "mlp_up_proj": gemm_op(m, s.up_out, h, dtype, device),
        "mlp_down_proj": gemm_op(m, h, s.mlp_shard, dtype, device),
        "add": (add, rough(3 * m * h * b, 0)),
    }
    return ops


def measure_model(model: Model, tokens, tps, timer: Timer, dtype, device) -> list[dict]:
    rows = []
    for tp in tps:
        if model.heads % tp or model.intermediate % tp:
            continue
        shard = Shard(
            hidden=model.hidden, intermediate=model.intermediate, heads=model.heads,
            kv_heads=model.kv_heads, head_dim=model.hidden // model.heads, vocab=model.vocab,
            gated=model.gated, tp=tp,
        )  # fmt: skip
        for m in tokens:
            row: dict = {}
            for op, (fn, guess) in layer_ops(shard, m, dtype, device).items():
                samples = [t * 1e3 for t in timer(fn, reps_for(guess))]  # milliseconds
                row.update(
                    {
                        f"time_stats.{op}.min": min(samples),
                        f"time_stats.{op}.max": max(samples),
                        f"time_stats.{op}.mean": statistics.fmean(samples),
                        f"time_stats.{op}.median": statistics.median(samples),
                        f"time_stats.{op}.std": statistics.pstdev(samples),
                    }
                )
            row.update(
                n_head=model.heads, n_kv_head=model.kv_heads, n_embd=model.hidden,
                n_expanded_embd=model.intermediate, vocab_size=model.vocab,
                use_gated_mlp=model.gated, num_tokens=m, num_tensor_parallel_workers=tp,
            )  # fmt: skip
            rows.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# Attention shapes: (heads, kv heads) of one GPU's shard, head dim 128.
ATTN_HEADS = ((32, 8), (8, 1), (64, 8), (32, 32))
PREFILL_TOKENS = (256, 1024, 2048, 4096, 8192)
DECODE = ((1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024), (64, 4096), (256, 512),
          (16, 8192))  # fmt: skip


def sdpa(q, k, v, causal: bool, _: int = 0) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def measure_attention(timer: Timer, dtype, device, quick: bool) -> list[dict]:
    """FlashAttention-style prefill (one causal prompt) and decode (batch x context, one
    query each, dense KV) through PyTorch's SDPA, with the bytes and FLOPs the cost model
    counts for each."""
    b = torch.finfo(dtype).bits // 8
    d = 128
    rows = []
    heads_list = ATTN_HEADS[:1] if quick else ATTN_HEADS
    for heads, kv in heads_list:
        for t in PREFILL_TOKENS[:2] if quick else PREFILL_TOKENS:
            q = torch.randn(1, heads, t, d, dtype=dtype, device=device)
            k = torch.randn(1, kv, t, d, dtype=dtype, device=device)
            v = torch.randn_like(k)
            flops = 4 * heads * d * t * (t + 1) / 2  # causal: half the square
            guess = rough(0, flops)
            samples = timer(partial(sdpa, q, k, v, True), reps_for(guess))
            rows.append(_attn_row("prefill", 1, t, t, heads, kv, d, flops,
                                  b * (2 * heads + 2 * kv) * t * d, samples))  # fmt: skip
        for batch, ctx in DECODE[:2] if quick else DECODE:
            q = torch.randn(batch, heads, 1, d, dtype=dtype, device=device)
            k = torch.randn(batch, kv, ctx, d, dtype=dtype, device=device)
            v = torch.randn_like(k)
            kv_bytes = b * batch * ctx * 2 * kv * d
            guess = rough(kv_bytes, 0)
            samples = timer(partial(sdpa, q, k, v, False), reps_for(guess))
            rows.append(_attn_row("decode", batch, 1, ctx, heads, kv, d,
                                  4 * heads * d * batch * ctx, kv_bytes, samples))  # fmt: skip
            del q, k, v
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _attn_row(kind, batch, q_tokens, context, heads, kv, d, flops, nbytes, samples) -> dict:
    return {
        "kind": kind, "batch": batch, "q_tokens": q_tokens, "context": context,
        "n_head": heads, "n_kv_head": kv, "head_dim": d, "flops": flops, "bytes": nbytes,
        "time_ms_median": statistics.median(samples) * 1e3,
        "time_ms_min": min(samples) * 1e3,
    }  # fmt: skip


def write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def gpu_tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return torch.cuda.get_device_name(device).replace("NVIDIA ", "").replace(" ", "-").lower()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--models", nargs="*", default=[m.name for m in MODELS])
    p.add_argument("--replays", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="a few rows only (a dry run)")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    dtype = getattr(torch, a.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    unknown = set(a.models) - {m.name for m in MODELS}
    if unknown:
        print(f"error: --models: unknown {sorted(unknown)}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    timer = Timer(device, 2 if a.quick else a.replays)
    tokens = QUICK_TOKENS if a.quick else TOKENS
    tps = (1, 2) if a.quick else TP
    tag = gpu_tag(device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        rows = measure_attention(timer, dtype, device, a.quick)
        write(a.out / f"{tag}_attention.csv", rows)
        print(f"attention: {len(rows)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    except RuntimeError as exc:  # an SDPA backend this torch lacks: the GEMM tables still run
        print(f"attention: not measured ({exc})", flush=True)
    by_name = {m.name: m for m in MODELS}
    for model in (by_name[n] for n in a.models):  # in the order asked: a timeout keeps the first
        t0 = time.perf_counter()
        rows = measure_model(model, tokens, tps, timer, dtype, device)
        write(a.out / f"{tag}_{model.name}.mlp.csv", rows)
        print(f"{model.name}: {len(rows)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
