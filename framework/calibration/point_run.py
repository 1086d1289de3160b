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
from framework.core.step_stats import HOST_PHASES, StepStats
from framework.engine.executor import Span
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
    time and the wait moves into the next readback; there the executor also gives events on
    the device's stream around the forward and the sampler (`ExecResult.span`), whose device
    seconds replace the launch times once the point's run has ended (`settle`): nothing here
    makes the host wait inside a step. `watch` also times the engine's drains, each step's,
    which on CUDA hold the host's waits for the device (`host_seconds` takes them out).
    """

    def __init__(self, inner: Any, device: torch.device) -> None:
        self.inner = inner
        self.device = device
        # (features, forward_s, sample_s, prepare_s) per step
        self.steps: list[tuple[StepFeatures, float, float, float]] = []
        self._spans: list[tuple[int, Span]] = []  # (step, its span) not read yet
        # Seconds in the readback's fetch, by the engine's step (CUDA only; None: not timed).
        self.fetch_s: dict[int, float] | None = None

    def watch(self, engine: Any) -> None:
        """Time each drain of `engine`'s held tokens, charged to the step it happens in (a
        GPU's only: on a CPU the drains wait for nothing)."""
        if self.device.type != "cuda":
            return
        fetch, steps = engine.readback.fetch, engine.steps
        got: dict[int, float] = {}  # seconds by step

        def timed(pending: Any) -> Any:
            t = time.perf_counter()
            values = fetch(pending)
            got[len(steps)] = got.get(len(steps), 0.0) + time.perf_counter() - t
            return values

        engine.readback.fetch = timed
        self.fetch_s = got

    def execute(self, batch: Any) -> Any:
        features = StepFeatures.of(batch)
        result = self.inner.execute(batch)
        if result.span is not None:
            self._spans.append((len(self.steps), result.span))
        self.steps.append((features, result.forward_s, result.sample_s, result.prepare_s))
        return result

    def settle(self) -> None:
        """The device seconds in place of the launch times, after the run: one wait, for the
        newest span (the older ones on the same stream are done before it)."""
        for i, span in reversed(self._spans):  # the newest first: then the others are done
            parts = span.parts() or span.wait()
            features, _, sample, prepare = self.steps[i]
            self.steps[i] = (features, parts[0], parts[1] if len(parts) > 1 else sample, prepare)
        self._spans.clear()

    def close(self) -> None:
        self.settle()


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
    # On CUDA, each step's seconds in the drains of its held tokens (`Recorder.watch`), by
    # its index in `stats`; None on a CPU.
    fetch_s: dict[int, float] | None = None

    def host(self, readback_s: float) -> list[float]:
        """Each step's host seconds (`host_seconds`)."""
        got = self.fetch_s
        return [
            host_seconds(st, readback_s, None if got is None else got.get(i, 0.0))
            for i, st in enumerate(self.stats)
        ]


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
    rec.watch(engine)
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
    run = PointRun(point, rec.steps, list(result.steps), wall, foreign, extra=paths)
    run.fetch_s = rec.fetch_s
    return run


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


def host_seconds(stats: StepStats, readback_s: float, fetch_s: float | None = None) -> float:
    """The engine's own host time in a step (the executor's block tables included, as the
    engine counts them in `build`), less the readbacks, which the profile prices apart.

    On CUDA (`fetch_s`: the step's seconds in its drains) the host's launches of the forward
    and the sampler are its work too (`host`, where the engine puts them once the device's
    seconds are read), and the drains are not: they hold the waits for the device and the
    copies, which the simulator adds itself."""
    host = sum(stats.phase_s.get(p, 0.0) for p in HOST_PHASES)
    if fetch_s is None:
        return max(0.0, host - stats.transfers * readback_s)
    return max(0.0, host + stats.phase_s.get("host", 0.0) - fetch_s)
