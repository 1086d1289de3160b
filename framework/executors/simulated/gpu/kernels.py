"""Kernel families and their fitted parameters.

Each family is a roofline with a few parameters that say how far a real kernel of that shape
falls short of it, so that a small GEMM is priced as what it is (a weight stream with a fixed
launch-and-tail cost) and a large one as tensor-core work split into tiles over the SMs:

- **GEMM** (`GemmFit`), `M` tokens x `K` in -> `N` out:
  memory = bytes / (bandwidth x `bandwidth`), the weights and activations streamed once;
  compute = waves x one tile's FLOPs at the SM's share of `compute` x peak, where the tiles
  are `tile_m` x 256 outputs, `waves` = tiles / SMs (rounded up by `wave_quantisation`, 0..1),
  and each tile's K loop carries `k_overhead` columns of prologue and epilogue;
  time = `fixed_s` + (memory^p + compute^p)^(1/p), p = `smoothness` (a large p is max()).
- **Stream** (`StreamFit`), norms, rotary, activation, residual add, embedding lookup, the KV
  write: time = `fixed_s` + bytes / (bandwidth x `bandwidth`).
- **Attention** (`AttentionFit`): prefill is FLOPs with the causal half skipped, at
  `prefill` x peak; decode is the KV bytes read, at `decode` x bandwidth; each kernel adds
  `fixed_s`: published kernel figures. Where a spec's `kernels:` holds a `prefill_attention`
  block (`PrefillAttentionFit`, fitted to a published attention table), prefill is instead
  its FLOPs at `compute` x peak plus `per_key_s` for every key of the context: a causal
  kernel's last query tiles stream every key on one SM each, a serial tail that more heads
  do not shorten, so a flat fraction of the peak reads short prompts, and a GPU's few heads
  under tensor parallelism, fast.
- **All-reduce** (`AllReduceFit`): latency + the ring's 2 (n-1)/n x bytes over the bus
  bandwidth, one pair of numbers per worker count (an alpha-beta fit).

The formulas are plain Python on floats (the simulator prices every step with them);
`experiments.gpu_fit` fits their parameters and `experiments.gpu_check` judges them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from framework.executors.simulated.cost import ProfileError

STREAM_FAMILIES = ("norm", "rotary", "activation", "add", "embedding")


def number(data: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
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


def _fields(cls: type, data: Any, where: str) -> dict[str, float]:
    """Every field of a fit dataclass, as a finite non-negative float."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: missing or not a mapping")
    return {f.name: number(data, f.name, where, positive=False) for f in fields(cls)}


def _fraction(value: float, where: str) -> float:
    if not 0 < value <= 1:
        raise ProfileError(f"{where}: a fraction of the peak, in (0, 1]; got {value}")
    return value


@dataclass(frozen=True)
class GemmFit:
    fixed_s: float  # launch and tail of one GEMM kernel
    bandwidth: float  # fraction of the memory peak a weight stream reaches
    compute: float  # fraction of the dense peak a full wave of tiles reaches
    k_overhead: float  # K columns' worth of prologue and epilogue per tile
    smoothness: float  # p of the p-norm joining the memory and compute times
    tile_m: float  # rows of a tile (its N side is 256)
    wave_quantisation: float  # 0: waves are fractional, 1: a partial wave costs a whole one

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GemmFit:
        v = _fields(cls, data, where)
        _fraction(v["bandwidth"], f"{where}.bandwidth")
        _fraction(v["compute"], f"{where}.compute")
        if v["smoothness"] < 1 or v["tile_m"] < 1 or v["wave_quantisation"] > 1:
            raise ProfileError(
                f"{where}: smoothness >= 1, tile_m >= 1 and wave_quantisation in [0, 1]"
            )
        return cls(**v)

    def seconds(
        self,
        m: float,
        n: float,
        k: float,
        b: float,
        bandwidth: float,
        peak: float,
        sms: int,
        bias: bool = False,
    ) -> float:
        """One GEMM of m x k by k x n in `b` bytes an element; a bias (n elements, added in
        the epilogue) is read with the weights."""
        if m <= 0:
            return 0.0
        elements = m * k + k * n + m * n + (n if bias else 0)
        memory = b * elements / (bandwidth * self.bandwidth)
        tiles = math.ceil(m / self.tile_m) * math.ceil(n / 256)
        w = tiles / sms
        waves = self.wave_quantisation * math.ceil(w) + (1 - self.wave_quantisation) * w
        tile_flops = 2 * self.tile_m * 256 * (k + self.k_overhead)
        compute = waves * tile_flops / (peak * self.compute / sms)
        p = self.smoothness
        return self.fixed_s + (memory**p + compute**p) ** (1 / p)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class StreamFit:
    fixed_s: float
    bandwidth: float  # fraction of the memory peak

    @classmethod
    def from_dict(cls, data: Any, where: str) -> StreamFit:
        v = _fields(cls, data, where)
        _fraction(v["bandwidth"], f"{where}.bandwidth")
        return cls(**v)

    def seconds(self, nbytes: float, bandwidth: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self.fixed_s + nbytes / (bandwidth * self.bandwidth)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class AttentionFit:
    fixed_s: float  # per attention kernel (a prefill one and a decode one per layer)
    prefill: float  # fraction of the dense peak a causal FlashAttention forward reaches
    decode: float  # fraction of the memory peak a paged decode kernel reaches on KV reads

    @classmethod
    def from_dict(cls, data: Any, where: str) -> AttentionFit:
        v = _fields(cls, data, where)
        _fraction(v["prefill"], f"{where}.prefill")
        _fraction(v["decode"], f"{where}.decode")
        return cls(**v)

    def prefill_seconds(
        self, flops: float, context: float, peak: float, fit: PrefillAttentionFit | None
    ) -> float:
        """One prefill kernel, its fixed cost included: the fitted form where the spec has
        one (`KernelFits.prefill_attention`), else the FLOPs at the flat `prefill` fraction.
        The one place both the simulator and `experiments.gpu_check` price it."""
        if fit is None:
            return self.fixed_s + flops / (peak * self.prefill)
        return self.fixed_s + fit.seconds(flops, context, peak)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class PrefillAttentionFit:
    """A causal prefill kernel as a published attention table times it: the FLOPs at a
    fraction of the dense peak, plus a serial cost per key of the context. The second term
    is why the table's achieved fraction of the peak rises with the prompt (Vidur's A100
    FlashInfer table, 32 heads a GPU: 0.35 of the peak at 2,048 tokens, 0.56 at 16,384):
    the last query tiles each stream the whole context on one SM, however many heads run
    beside them. Fitted by `experiments.gpu_fit --attention` (docs/simulator-analytic.md)."""

    compute: float  # fraction of the dense peak the quadratic part reaches
    per_key_s: float  # seconds per key of the context, per kernel (the longest tile's loop)
    fitted_on: str = ""  # the table and rows the fit read

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PrefillAttentionFit:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: not a mapping")
        compute = _fraction(number(data, "compute", where), f"{where}.compute")
        per_key = number(data, "per_key_s", where, positive=False)
        return cls(compute, per_key, str(data.get("fitted_on") or ""))

    def seconds(self, flops: float, context: float, peak: float) -> float:
        """One prefill kernel's time (without the family's fixed cost): `flops` as the
        causal count gives them, over `context` keys (the longest row's, or its best
        estimate from the step's features)."""
        return flops / (peak * self.compute) + self.per_key_s * context

    def to_dict(self) -> dict[str, Any]:
        return {"fitted_on": self.fitted_on, "compute": self.compute, "per_key_s": self.per_key_s}


@dataclass(frozen=True)
class AllReduceFit:
    """latency_s + 2 (n - 1) / n x bytes / bus_bandwidth, per worker count n."""

    latency_s: dict[int, float]
    bus_bandwidth: dict[int, float]  # bytes/s

    @classmethod
    def from_dict(cls, data: Any, where: str) -> AllReduceFit:
        if not isinstance(data, dict) or not data:
            raise ProfileError(f"{where}: missing or not a mapping of worker counts")
        latency, bus = {}, {}
        for key, value in data.items():
            try:
                n = int(key)
            except (TypeError, ValueError):
                raise ProfileError(f"{where}.{key}: not a worker count") from None
            if n < 2:
                raise ProfileError(f"{where}.{key}: a worker count is >= 2")
            v = _fields(_AlphaBeta, value, f"{where}.{key}")
            if v["bus_bandwidth"] <= 0:
                raise ProfileError(f"{where}.{key}.bus_bandwidth: must be > 0")
            latency[n], bus[n] = v["latency_s"], v["bus_bandwidth"]
        return cls(latency, bus)

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(sorted(self.latency_s))

    def seconds(self, nbytes: float, workers: int) -> float:
        if workers <= 1 or nbytes <= 0:
            return 0.0
        if workers not in self.latency_s:
            have = ", ".join(str(n) for n in self.workers)
            raise ProfileError(
                f"executor.tensor_parallel={workers}: the interconnect has all-reduce times "
                f"for {have} workers only"
            )
        ring = 2 * (workers - 1) / workers
        return self.latency_s[workers] + ring * nbytes / self.bus_bandwidth[workers]

    def to_dict(self) -> dict[int, dict[str, float]]:
        return {
            n: {"latency_s": self.latency_s[n], "bus_bandwidth": self.bus_bandwidth[n]}
            for n in self.workers
        }


@dataclass(frozen=True)
class _AlphaBeta:
    latency_s: float
    bus_bandwidth: float


@dataclass(frozen=True)
class KernelFits:
    """One GPU's fitted kernel families: the `kernels:` section of a hardware spec."""

    gemm: GemmFit
    stream: dict[str, StreamFit]  # by STREAM_FAMILIES
    fitted_on: str = ""  # the table the fit read, as its command named it
    # Prefill attention fitted to a published attention table; None: the spec's `attention`
    # fraction alone prices it (a flat fraction of the peak).
    prefill_attention: PrefillAttentionFit | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "hardware.kernels") -> KernelFits:
        if not isinstance(data, dict):
            raise ProfileError(
                f"{where}: missing; fit one with `python -m experiments.gpu_fit TABLE.csv "
                "--hardware NAME`, or copy a shipped spec's"
            )
        stream_in = data.get("stream")
        if not isinstance(stream_in, dict):
            raise ProfileError(f"{where}.stream: missing or not a mapping")
        stream = {}
        for family in STREAM_FAMILIES:
            stream[family] = StreamFit.from_dict(stream_in.get(family), f"{where}.stream.{family}")
        prefill = data.get("prefill_attention")
        return cls(
            gemm=GemmFit.from_dict(data.get("gemm"), f"{where}.gemm"),
            stream=stream,
            fitted_on=str(data.get("fitted_on") or ""),
            prefill_attention=(
                None
                if prefill is None
                else PrefillAttentionFit.from_dict(prefill, f"{where}.prefill_attention")
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fitted_on": self.fitted_on,
            "gemm": self.gemm.to_dict(),
            "stream": {k: v.to_dict() for k, v in self.stream.items()},
        }
        if self.prefill_attention is not None:
            out["prefill_attention"] = self.prefill_attention.to_dict()
        return out
