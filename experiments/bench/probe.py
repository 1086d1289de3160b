"""What this machine can do, measured in the benchmark's own process and thread count, and
how close the engine's decode steps come to it.

- memory bandwidth: the best of a few timed reductions (`sum`) over a large fp32 tensor,
  in GB/s read: a decode step at batch 1 must read every weight once, so
  floor = weight bytes / bandwidth is the fastest a batch-1 step can be;
- matmul rate: the best of a few square matmuls in the run's dtype, in GFLOP/s: a token
  costs about 2 x (weights) FLOPs, so ceiling = rate / (2 x weights) tokens/s bounds any batch;
- the Linear layers alone: every `nn.Linear` of the model, in order, as the engine runs it
  (packed oneDNN or stock, as chosen on this machine), on 1 row and on the largest batch's
  rows, weights cache-cold as in a step. No engine can run a decode step faster than its
  Linear kernels read and multiply the weights, so these say how much of each gap is the
  kernels' and how much the engine's (attention, norms, host work);
- the engine's decode steps: one request (batch 1, whole step: host work included), the
  largest batch (`max_num_seqs` identical requests, tokens/s over the steps where every row
  decodes), and batch 8, whose steps give the host overhead at batch 8 and the paged forward
  that is compared with a dense Hugging Face forward (DynamicCache, sdpa) over the same
  prompts and contexts.

"Weights" counts every matrix a decode step multiplies: all parameters, less the input
embedding unless it is tied to the output head (a lookup reads one row of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from experiments.bench.peers import plain_hf
from framework.calibration.machine_load import best_time, sync
from framework.core.request import RequestSpec
from framework.core.step_stats import StepStats
from framework.executors.packed_linear import packable


@dataclass
class Probe:
    """The machine section of the benchmark (seconds, GB/s, GFLOP/s, tokens/s), in one dtype
    (the matmul rate and the Linear layers are timed in the model's own)."""

    threads: int
    bandwidth_gbs: float
    matmul_gflops: float
    weight_bytes: int
    weight_params: int
    floor_s: float  # weight bytes / bandwidth
    batch1_step_s: float | None
    ceiling_tps: float  # matmul rate / (2 x weight params)
    largest_batch: int
    largest_batch_tps: float | None
    linears_b1_s: float  # every Linear once on 1 row: the kernels' own batch-1 floor
    linears_big_s: float  # every Linear once on `largest_batch` rows
    host_share_b8: float | None
    paged_b8_s: float | None
    dense_b8_s: float | None  # dense attention, the engine's Linear layers
    stock_b8_s: float | None  # plain Hugging Face: dense attention, PyTorch's stock Linear
    dtype: str = "float32"
    # The share of the largest batch's decode steps spent outside the Linear layers
    # (attention, norms, rotary, activations, sampling, host work), the Linear layers timed
    # inside those very steps (`LinearClock`).
    outside_linears_big: float | None = None
    # The Linear layers' seconds inside each batch-1 decode step, timed in place: the step
    # against these is the step against its own kernels (`linears_b1_s` is a separate pass).
    linears_in_b1_step_s: float | None = None

    @property
    def largest_step_s(self) -> float | None:
        """One decode step of the largest batch (every row decoding), whole."""
        tps = self.largest_batch_tps
        return self.largest_batch / tps if tps else None


def memory_bandwidth(mb: int, repeats: int, device: torch.device) -> float:
    """GB/s read by a reduction over `mb` MiB of fp32."""
    x = torch.ones(mb * 2**20 // 4, dtype=torch.float32, device=device)
    s = best_time(lambda: x.sum(), repeats, device)
    return x.numel() * 4 / s / 1e9


def matmul_rate(n: int, repeats: int, device: torch.device, dtype: torch.dtype) -> float:
    """GFLOP/s of an `n` x `n` matmul in `dtype` (2 n^3 FLOPs): the faster of PyTorch's stock
    matmul and, on a CPU with oneDNN, oneDNN's linear on a prepacked weight (the kernel the
    engine may run, framework/executors/packed_linear.py, where oneDNN has a path for the
    dtype on this CPU), so the ceiling is the machine's, not one library's."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    s = best_time(lambda: a @ b, repeats, device)
    if device.type == "cpu" and torch.backends.mkldnn.is_available() and packable(dtype):
        packed = torch.ops.mkldnn._reorder_linear_weight(b, n)
        linear = torch.ops.mkldnn._linear_pointwise
        s = min(s, best_time(lambda: linear(a, packed, None, "none", [], ""), repeats, device))
    return 2 * n**3 / s / 1e9


@torch.inference_mode()
def linear_pass_s(model: Any, rows: int, repeats: int, head_rows: int | None = None) -> float:
    """Best seconds of one pass through every `nn.Linear` of `model` in module order (each
    layer's projections, then the head), each through the layer's own forward on `rows`
    random rows (the head on `head_rows`, as a step keeps only each row's last position).
    The whole pass reads more than any cache holds, so each weight is read cold, as in a
    decode step."""
    device, dtype = model.device, model.dtype
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {}
    for m in linears:
        n = head_rows if m is head and head_rows is not None else rows
        inputs[m] = torch.randn(n, m.in_features, device=device).to(dtype)
    return best_time(lambda: [m(inputs[m]) for m in linears], repeats, device)


def linears_alone_s(model: Any, steps: list[StepStats], repeats: int = 1) -> float:
    """Seconds the Linear layers alone need for a run's steps: a `linear_pass_s` at each
    step's token count (its head on the step's rows). A bound on any engine running these
    kernels over the same steps."""
    passes: dict[tuple[int, int], float] = {}
    total = 0.0
    for st in steps:
        key = (st.prefill_tokens + st.rows - st.prefill_rows, st.rows)
        if key[1] == 0:
            continue
        if key not in passes:
            passes[key] = linear_pass_s(model, key[0], repeats, head_rows=key[1])
        total += passes[key]
    return total


class LinearClock:
    """Seconds spent inside the model's `nn.Linear` layers during the forwards of `rows`
    query tokens (decode steps of that many rows), timed in place by forward hooks: the
    share of a real step that is the Linear layers, without a separate pass whose weights,
    inputs or machine speed differ from the step's. (CPU: a layer's call returns when its
    work is done.)"""

    def __init__(self, model: Any, rows: int) -> None:
        self.model, self.rows, self.seconds, self.on = model, rows, 0.0, False
        self.steps = 0  # forwards of `rows` query tokens seen
        self._t = 0.0
        self._handles: list[Any] = []

    def __enter__(self) -> LinearClock:
        def step(_m: Any, args: Any, kwargs: Any) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.on = ids is not None and ids.numel() == self.rows
            self.steps += self.on

        def pre(_m: Any, _args: Any) -> None:
            self._t = time.perf_counter()

        def post(_m: Any, _args: Any, _out: Any) -> None:
            if self.on:
                self.seconds += time.perf_counter() - self._t

        self._handles.append(self.model.register_forward_pre_hook(step, with_kwargs=True))
        for m in self.model.modules():
            if isinstance(m, torch.nn.Linear):
                self._handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()

    def per_step(self) -> float | None:
        """The Linear layers' seconds in one forward of `rows` query tokens."""
        return self.seconds / self.steps if self.steps and self.seconds else None


def decode_weights(model: Any) -> tuple[int, int]:
    """(bytes, parameters) of the weights one decode step multiplies (see the module)."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    size = sum(p.numel() * p.element_size() for p in params)
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embed:
        n -= embed.numel()
        size -= embed.numel() * embed.element_size()
    return size, n


def step_wall(st: StepStats) -> float:
    """A step's whole time: every phase, host work included."""
    return sum(st.phase_s.values())


def host_share(st: StepStats) -> float:
    """The share of a step that is not the model forward or sampling."""
    wall = step_wall(st)
    work = st.phase_s.get("forward", 0.0) + st.phase_s.get("sample", 0.0)
    return (wall - work) / wall if wall > 0 else 0.0


def decode_steps(steps: list[StepStats], rows: int | None = None) -> list[StepStats]:
    """Steps without a prefill row (and with exactly `rows` rows, when given)."""
    return [
        st
        for st in steps
        if st.prefill_rows == 0 and st.rows > 0 and (rows is None or st.rows == rows)
    ]


def median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


@torch.inference_mode()
def dense_decode_s(model: Any, prompts: list[list[int]], steps: int, stock: bool) -> float | None:
    """Median seconds of one dense Hugging Face decode forward (DynamicCache, sdpa) over
    equal-length prompts, greedy, for `steps` steps after the prefill. `stock`: with
    PyTorch's own Linear (plain Hugging Face); otherwise with the Linear layers as the engine
    runs them, so that the comparison isolates paged against dense attention."""
    with plain_hf(model, stock_linear=stock):
        ids = torch.tensor(prompts, device=model.device)
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, cache=cache, use_cache=True)
        times = []
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            sync(model.device)
            t = time.perf_counter()
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            sync(model.device)
            times.append(time.perf_counter() - t)
    return median(times)


def probe(
    model: Any,
    run_same: Callable[[int], tuple[list[RequestSpec], list[StepStats]]],
    max_batch: int,
    threads: int,
    mb: int,
    matmul_n: int,
    repeats: int = 5,
) -> Probe:
    """The machine section. `run_same(n)` serves `n` identical-length requests through the
    engine and returns (requests, steps)."""
    device = model.device
    bandwidth = memory_bandwidth(mb, repeats, device)
    gflops = matmul_rate(matmul_n, repeats, device, model.dtype)
    size, n = decode_weights(model)
    # Each size twice: once for the steps' walls, once with the Linear layers clocked in
    # place (the clock's hooks cost each step about a millisecond of their own, which is the
    # probe's, not the engine's).
    _, one = run_same(1)
    with LinearClock(model, 1) as clock1:
        run_same(1)
    _, big = run_same(max_batch)
    with LinearClock(model, max_batch) as clock:
        run_same(max_batch)
    specs8, eight = run_same(8)
    b1 = median([step_wall(st) for st in decode_steps(one, 1)])
    b1_linear = clock1.per_step()
    full = decode_steps(big, max_batch)
    big_tps = median([max_batch / step_wall(st) for st in full])
    big_linear = clock.per_step()
    big_step = mean([step_wall(st) for st in full])
    outside = 1.0 - big_linear / big_step if big_step and big_linear else None
    at8 = decode_steps(eight, 8)
    prompts8 = [s.prompt_token_ids for s in specs8]
    dense = dense_decode_s(model, prompts8, len(at8), stock=False)
    stock = dense_decode_s(model, prompts8, len(at8), stock=True)
    return Probe(
        threads=threads,
        bandwidth_gbs=bandwidth,
        matmul_gflops=gflops,
        weight_bytes=size,
        weight_params=n,
        floor_s=size / (bandwidth * 1e9),
        batch1_step_s=b1,
        ceiling_tps=gflops * 1e9 / (2 * n),
        largest_batch=max_batch,
        largest_batch_tps=big_tps,
        linears_b1_s=linear_pass_s(model, 1, repeats),
        linears_big_s=linear_pass_s(model, max_batch, repeats),
        host_share_b8=mean([host_share(st) for st in at8]),
        paged_b8_s=median([st.phase_s.get("forward", 0.0) for st in at8]),
        dense_b8_s=dense,
        stock_b8_s=stock,
        dtype=str(model.dtype).removeprefix("torch."),
        outside_linears_big=outside,
        linears_in_b1_step_s=b1_linear,
    )
