"""One grid point served and timed (`PointRun`): the real engine serves it with its executor
wrapped in a recorder that keeps every step's features and seconds, and the machine's share
of other processes' work during the run is kept beside them."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from framework.calibration.grid import Point, workload
from framework.calibration.machine_load import cpu_seconds, foreign_share, sync
from framework.engine.counters import HOST_PHASES, StepStats
from framework.engine.readback import Readback
from framework.executors.packed_linear import PACKED
from framework.executors.simulated.features import StepFeatures
from framework.run.app import build_engine
from framework.run.compose import compose_cfg
from framework.run.in_process import NullHooks
from framework.workloads import build_workload


class Recorder:
    """The real executor, each step's features and seconds kept.

    On CPU the seconds are the executor's own (as the engine reports them). On CUDA the
    model call returns once its kernels are queued, so the executor's forward_s is the launch
    time and the wait moves into the next readback; here the model call is bracketed by
    synchronisations (forward hooks), so forward_s and sample_s are the device's seconds.
    """

    def __init__(self, inner: Any, device: torch.device) -> None:
        self.inner = inner
        self.device = device
        # (features, forward_s, sample_s, prepare_s) per step
        self.steps: list[tuple[StepFeatures, float, float, float]] = []
        self._marks: list[float] = []
        if device.type == "cuda":
            model = inner.model
            self._hooks = [
                model.register_forward_pre_hook(lambda *_: self._mark()),
                model.register_forward_hook(lambda *_: self._mark()),
            ]

    def _mark(self) -> None:
        sync(self.device)
        self._marks.append(time.perf_counter())

    def execute(self, batch: Any) -> Any:
        features = StepFeatures.of(batch)
        self._marks.clear()
        result = self.inner.execute(batch)
        forward, sample = result.forward_s, result.sample_s
        if self.device.type == "cuda" and len(self._marks) == 2:
            sync(self.device)
            forward = self._marks[1] - self._marks[0]
            sample = time.perf_counter() - self._marks[1]
        self.steps.append((features, forward, sample, result.prepare_s))
        return result

    def close(self) -> None:
        for h in getattr(self, "_hooks", []):
            h.remove()


@dataclass
class PointRun:
    """One grid point's run: its steps as the recorder kept them and as the engine counted
    them, and how disturbed the machine was meanwhile."""

    point: Point
    steps: list[tuple[StepFeatures, float, float, float]]  # features, forward, sample, prepare
    stats: list[StepStats]
    wall_s: float
    foreign: float  # share of all CPUs that other processes used during the run
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    # The machine's state around the run: the means of the probe pairs timed just before and
    # just after it (a 1-row decode step, a 128-token prefill), seconds. None: not probed.
    probes: tuple[float, float] | None = None


def point_cfg(overrides: list[str], point: Point, block_size: int) -> DictConfig:
    blocks = sum(
        -(-(p + o) // block_size) for p, o in zip(point.prompt_lens, point.output_lens, strict=True)
    )
    budget = max(max(point.prompt_lens) + max(point.output_lens), 2048, point.max_num_seqs)
    return compose_cfg(
        [
            *overrides,
            "scheduler=continuous",
            "allocator=incremental",
            "preemption=recompute",
            "output=immediate",
            f"engine.max_num_seqs={point.max_num_seqs}",
            f"engine.max_num_batched_tokens={budget}",
            f"engine.num_blocks={blocks + 2}",
        ]
    )


def serve_point(overrides: list[str], loaded: tuple[Any, ...], point: Point, seed: int) -> PointRun:
    model, tok, device, dtype = loaded
    base = compose_cfg(overrides)
    cfg = point_cfg(overrides, point, base.engine.block_size)
    specs = build_workload(workload(point, seed), tok)
    engine = build_engine(cfg, model, device, dtype, NullHooks())
    rec = Recorder(engine.executor, device)
    engine.executor = rec
    before = cpu_seconds()
    t = time.perf_counter()
    try:
        result = engine.run(specs, tok.eos_token_id)
    finally:
        rec.close()
    wall = time.perf_counter() - t
    foreign = foreign_share(before, cpu_seconds(), wall)
    packed = any(hasattr(m, PACKED) for m in model.modules())  # as this engine left it
    paths = {
        "linear": "onednn-packed (rows bucketed)" if packed else "torch",
        "decode_attention": (
            "flex-attention"
            if rec.inner.flex_dec.use
            else "paged-kernel"
            if rec.inner.kernel
            else "gather+sdpa"
        ),
        "argmax": "kernel" if rec.inner.greedy.use else "torch",
    }
    return PointRun(point, rec.steps, list(result.steps), wall, foreign, extra=paths)


def readback_seconds(device: torch.device, rows: int = 16, n: int = 200) -> float:
    """One host readback of a step's sampled tokens, as the engine does it (`Readback`),
    with nothing queued before it: the transfer's own cost (the median of n)."""
    rb = Readback(device)
    tokens = torch.zeros(rows, dtype=torch.long, device=device)
    times = []
    for _ in range(n):
        pending = rb.start(tokens)
        sync(device)
        t = time.perf_counter()
        rb.fetch([pending])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def host_seconds(stats: StepStats, readback_s: float) -> float:
    """The engine's own host time in a step (the executor's block tables included, as the
    engine counts them in `build`), less the readbacks, which the profile prices apart."""
    host = sum(stats.phase_s.get(p, 0.0) for p in HOST_PHASES)
    return max(0.0, host - stats.transfers * readback_s)
