"""Calibrate: time the real executor over a grid of steps and fit a simulator profile.

    python -m experiments.calibrate                              # SmolLM2, float32, this CPU
    python -m experiments.calibrate dtype=bfloat16 --out smollm2-bf16.yaml
    python -m experiments.calibrate --quick --out /tmp/tiny.yaml  # tiny model, seconds
    python -m experiments.calibrate device=cuda                  # a GPU: one short script

One process, one loaded model. Each grid point is a `fixed` workload served by the real
engine (continuous batching, every request at t=0, so its steps are the same on every run):
N requests of prompt P give prefill steps of up to the token budget, then decode steps of N
rows at contexts P..P+out; more requests than `max_num_seqs`, with staggered output lengths,
give mixed steps (a newcomer's prefill beside the others' decodes); slices of the Azure trace
give the mix of lengths a real workload has. The executor is wrapped in a recorder that keeps
every step's `StepFeatures` and seconds (on CUDA it synchronises around the model call, so the
seconds are the device's, not the launches'); the engine's own `StepStats` give its host time.

Fitting (framework/executors/simulated/profile.py): non-negative least squares on relative
error, over the grid points not marked `holdout`; the error is reported on the held-out
points, whole configurations the fit never saw, not random steps of runs it did. The profile
(YAML) names the model, dtype, device, CPU and its ISA flags or GPU, threads, date and commit,
and holds the grid and the fit's errors. Logged to MLflow (nanoserve.kind=calibration).

The machine may be shared: a point during which other processes took more than
`--max-foreign` of the CPUs (from /proc/stat, less this process's own time) is measured
again, up to twice, and only undisturbed runs are fitted; a canary (a 1-row decode step) and a
prefill probe are timed at the start, the end and after every point. The profile records them
(docs/simulator-profiles.md).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.benchmark import DEFAULT_TRACE, NullHooks, compose_cfg
from experiments.benchmark import fit as fit_lengths
from experiments.machine_probe import cpu_seconds
from framework.engine.counters import HOST_PHASES, StepStats
from framework.engine.readback import Readback
from framework.executors.packed_linear import PACKED
from framework.executors.simulated.cost import model_id
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.profile import LinearCost, MeasuredProfile, Sample, fit_host
from framework.run.app import build_engine, check_before_loading, load, resolve_device
from framework.tracking.machine import cpu_info
from framework.tracking.tags import environment_tags
from framework.workloads import build_workload
from framework.workloads.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
# Forward terms, by the code path the steps take; NNLS drops (zeroes) what does not help.
# Measured on SmolLM2 fp32 on the reference CPU, two passes of the grid, fitted terms
# against held-out runs (per step MAPE / mean run error / worst run error):
#   tokens, >16, >64, rows, prefill_rows, prefill_attn, decode_ctx        9.5% / 5.4% / 11.0%
#   the same + padded                                                     8.4% / 3.2% /  8.6%
#   the same + padded + has_prefill                                       8.1% / 2.7% /  4.9%
#   hinges at 8 and 32 instead of 16 and 64, + padded + has_prefill       7.3% / 3.1% /  4.8%
# (a step's own noise on this shared VM is about 5%: repeated steps of one shape spread
# +-10%). The terms: `linear_tokens` is what the Linear layers multiply (padded to oneDNN's
# buckets on CPU fp32); the hinges bend it from the memory-bound regime (a few rows: every
# weight read once, nearly flat up to 8 rows) to the compute-bound one; `rows` is the LM
# head, run on each row's last token only; `prefill_rows` each prompt's own attention call;
# `prefill_attn` the prompts' causal attention (queries x context); `decode_ctx` the KV the
# decode rows read; `padded` the packed layers' pad-and-slice (a few ms a step, whenever the
# row count is off a bucket); `has_prefill` the prefill path's fixed cost.
CPU_PACKED_TERMS = (
    "linear_tokens",
    "linear_tokens>8",
    "linear_tokens>32",
    "rows",
    "prefill_rows",
    "prefill_attn",
    "decode_ctx",
    "padded",
    "has_prefill",
)
# Unpacked (stock linears: chosen on this machine, or packed_linears=false): no buckets, so
# the real token count.
# Decode attention there gathers every decode row's blocks padded to the longest context.
CPU_TERMS = (
    *(t.replace("linear_tokens", "num_tokens") for t in CPU_PACKED_TERMS if t != "padded"),
    "decode_padded_ctx",
)
# A GPU in eager mode is launch-bound up to hundreds of tokens: later hinges; per-row
# attention calls (prefill) and the padded decode gather cost launches and bandwidth.
CUDA_TERMS = (
    "num_tokens",
    "num_tokens>64",
    "num_tokens>256",
    "num_tokens>1024",
    "rows",
    "prefill_rows",
    "prefill_attn",
    "decode_rows",
    "decode_ctx",
    "decode_padded_ctx",
    "has_prefill",
)


def forward_terms(device: torch.device, packed: bool) -> tuple[str, ...]:
    if device.type == "cuda":
        return CUDA_TERMS
    return CPU_PACKED_TERMS if packed else CPU_TERMS


SAMPLE_TERMS = ("rows", "random_rows")
# The real executor's tensor preparation: a list entry per packed token (ids, positions, slot
# mapping), a block table per decode row (as long as its context), a few tensors per step.
PREPARE_TERMS = ("rows", "num_tokens", "decode_ctx")
SAMPLED = {"temperature": 0.7, "top_p": 0.9}  # the grid's sampled (random) requests


# ---- the grid -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One configuration: a fixed workload, every request at t=0, and its batch limits."""

    name: str
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    max_num_seqs: int
    holdout: bool = False
    sampled: bool = False  # temperature > 0: the sampler's random path


def decode(n: int, p: int, out: int, holdout: bool = False, sampled: bool = False) -> Point:
    """n rows decoding together at context p..p+out, after their prefill."""
    kind = "sampled" if sampled else "decode"
    return Point(f"{kind}-{n}x{p}", (p,) * n, (out,) * n, n, holdout, sampled)


def mixed(n: int, p: int, waves: int = 2, holdout: bool = False) -> Point:
    """waves x n requests through n slots, output lengths staggered (3 to about 27) so that
    rows finish a few at a time and each newcomer's prefill shares a step with the others'
    decodes."""
    outs = tuple(3 + (i % n) * 24 // n + i // n for i in range(waves * n))
    return Point(f"mixed-{n}x{p}", (p,) * (waves * n), outs, n, holdout)


def trace(
    tok_rows: list[tuple[int, int]],
    name: str,
    n: int,
    max_prompt: int,
    max_output: int,
    holdout: bool = False,
) -> Point:
    """A slice of the Azure conversation trace, lengths scaled as the benchmark scales them
    (experiments/benchmark.py `fit`), all queued at t=0 through n slots."""
    prompts = fit_lengths([c for c, _ in tok_rows], max_prompt, "scale")
    outputs = fit_lengths([g for _, g in tok_rows], max_output, "scale")
    return Point(name, tuple(prompts), tuple(outputs), n, holdout)


def trace_rows(start: int, count: int) -> list[tuple[int, int]]:
    if not DEFAULT_TRACE.is_file():
        return []
    return [(r.context_tokens, r.generated_tokens) for r in read_trace(DEFAULT_TRACE, start, count)]


def full_grid() -> list[Point]:
    """SmolLM2-sized: two and a half minutes a pass on two CPU cores, the prefills most of
    it. Each tuple is (rows, prompt length, output length)."""
    short = [(n, 16, 10) for n in (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)]
    long = [(1, 1024, 10), (1, 2048, 6), (4, 512, 10), (2, 1024, 8), (8, 256, 10)]
    long += [(8, 512, 8), (32, 128, 10)]
    prompts = [(2, 384, 4), (8, 64, 4), (1, 160, 4), (3, 700, 3)]
    points = [decode(*x) for x in short + long + prompts]
    points += [mixed(n, p) for n, p in ((4, 64), (8, 32), (8, 128), (16, 48), (24, 24), (4, 384))]
    points += [decode(8, 16, 12, sampled=True), decode(32, 16, 8, sampled=True)]
    # Held out: interior points of each family, never fitted.
    held = [(10, 16, 10), (28, 16, 10), (2, 768, 8), (12, 256, 8), (5, 200, 4)]
    points += [decode(*x, holdout=True) for x in held]
    points += [mixed(12, 64, holdout=True), mixed(6, 256, holdout=True)]
    points += [decode(16, 16, 10, sampled=True, holdout=True)]
    rows = trace_rows(0, 48)
    if rows:  # the shapes of the benchmark's queued slice: one slice fitted, one held out
        points.append(trace(rows[24:48], "azure-24-48", 16, 128, 32))
        points.append(trace(rows[:24], "azure-0-24", 16, 128, 32, holdout=True))
    return points


def cuda_grid() -> list[Point]:
    """The CPU grid, and the sizes where a GPU only starts to work: up to 256 rows and
    8k-token prefills (a minute or two of SmolLM2 on one GPU)."""
    more = [(128, 16, 10), (256, 16, 8), (64, 512, 8), (128, 256, 6), (4, 2048, 6)]
    held = [decode(96, 16, 10, holdout=True), decode(32, 1024, 6, holdout=True)]
    return [*full_grid(), *(decode(*x) for x in more), mixed(64, 64), mixed(128, 32), *held]


def quick_grid() -> list[Point]:
    """For tests on the tiny model: a handful of runs, a few seconds."""
    fitted = [decode(1, 8, 5), decode(4, 16, 5), decode(8, 8, 4), decode(2, 64, 4), mixed(4, 16)]
    held = [decode(3, 24, 4, holdout=True), mixed(3, 12, holdout=True)]
    return [*fitted, decode(4, 8, 4, sampled=True), *held]


# ---- measuring ----------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def others_share(window_s: float = 0.5) -> float:
    """The share of all CPUs that other processes used over the next `window_s` seconds
    (this process sleeps meanwhile)."""
    busy0, own0 = cpu_seconds()
    time.sleep(window_s)
    busy1, own1 = cpu_seconds()
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / (window_s * (os.cpu_count() or 1))


@dataclass
class Measured:
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


def workload(point: Point, seed: int) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "kind": "fixed",
        "prompt_lens": list(point.prompt_lens),
        "output_lens": list(point.output_lens),
        "seed": seed,
    }
    return wl | (SAMPLED if point.sampled else {})


def serve_point(overrides: list[str], loaded: tuple[Any, ...], point: Point, seed: int) -> Measured:
    model, tok, device, dtype = loaded
    base = compose_cfg(overrides)
    cfg = point_cfg(overrides, point, base.engine.block_size)
    specs = build_workload(workload(point, seed), tok)
    engine = build_engine(cfg, model, device, dtype, NullHooks())
    rec = Recorder(engine.executor, device)
    engine.executor = rec
    busy0, own0 = cpu_seconds()
    t = time.perf_counter()
    try:
        result = engine.run(specs, tok.eos_token_id)
    finally:
        rec.close()
    wall = time.perf_counter() - t
    busy1, own1 = cpu_seconds()
    foreign = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1))
    packed = any(hasattr(m, PACKED) for m in model.modules())  # as this engine left it
    paths = {
        "linear": "onednn-packed (rows bucketed)" if packed else "torch",
        "decode_attention": "paged-kernel" if rec.inner.kernel else "gather+sdpa",
        "argmax": "kernel" if rec.inner.greedy.use else "torch",
    }
    return Measured(point, rec.steps, list(result.steps), wall, foreign, extra=paths)


# One request's five 1-row decode steps: every weight read once, as bandwidth-bound as a
# step gets. experiments/sim_check.py times the same probe against `fit.canary_best_s`.
CANARY = Point("canary", (16,), (6,), 1)
# One 128-token prompt's prefill, mostly the Linear layers' arithmetic: the compute-bound
# probe beside it (`fit.prefill_canary_best_s`). A shared VM's neighbours slow the two apart.
PREFILL_CANARY = Point("canary-prefill", (128,), (1,), 1)


class Gate:
    """Keeps other processes' work out of the measurements.

    A point during which other processes took more than `max_foreign` of the CPUs (from
    /proc/stat, less this process's own time) is measured again, up to `tries` times, each
    time after waiting (up to `max_wait_s`, and `wait_budget_s` over the whole run) for
    their share to fall; the quietest attempt is kept.

    The machine's own noise is not gated: on this project's VM a 1-row decode step moves
    between 35 and 53 ms from one second to the next with nothing else running (and runs
    slower for a while after the CPUs idled), so a canary gate that tight mostly discarded
    noise that every real run has too, and its own pauses made the next canary slower.
    A canary and a prefill probe are timed three times at the start and the end (`canary`),
    to say how far the machine drifted over the calibration, and once after every grid point
    (`between_points`), whose medians are the state the fit describes.
    """

    def __init__(
        self,
        serve: Callable[[Point], Measured],
        max_foreign: float,
        max_wait_s: float,
        wait_budget_s: float = 120.0,
        tries: int = 3,
        enabled: bool = True,
    ) -> None:
        self.serve = serve
        self.max_foreign, self.max_wait_s, self.wait_budget_s = (
            max_foreign,
            max_wait_s,
            wait_budget_s,
        )
        self.tries = tries if enabled else 1
        self.enabled = enabled
        self.waited_s = 0.0
        self.retries = 0
        self.best_canary = float("inf")  # the quietest canary run's median step
        self.best_prefill = float("inf")  # the quietest prefill probe's step
        # One pair of probes after each grid point: the machine's typical state while the
        # grid was measured, as a median, the statistic sim_check takes around real runs.
        self.grid_canaries: list[float] = []
        self.grid_prefills: list[float] = []
        self.last: tuple[float, float] | None = None  # the latest pair of probes

    def probes(self) -> tuple[float, float]:
        """One canary run's median decode step and one prefill probe's step, seconds."""
        got = self.serve(CANARY)
        decode = statistics.median(s[1] for s in got.steps if s[0].prefill_rows == 0)
        prefill = sum(s[1] for s in self.serve(PREFILL_CANARY).steps)
        self.best_canary = min(self.best_canary, decode)
        self.best_prefill = min(self.best_prefill, prefill)
        self.last = (decode, prefill)
        return decode, prefill

    def canary(self, n: int = 3) -> float:
        """The median over `n` canary runs, back to back, of each run's median decode step;
        each followed by the prefill probe. The quietest of each is kept."""
        return statistics.median(self.probes()[0] for _ in range(n))

    def between_points(self) -> None:
        """The probes once more, between two grid points: the grid's own state."""
        decode, prefill = self.probes()
        self.grid_canaries.append(decode)
        self.grid_prefills.append(prefill)

    def busy(self, m: Measured) -> bool:
        return m.foreign > self.max_foreign

    @property
    def spent(self) -> bool:
        """The whole run's waiting budget is used up: measure on, as the machine is."""
        return self.waited_s >= self.wait_budget_s

    def wait(self) -> None:
        """Until the others' share is back in bounds (or the time allowed is up)."""
        t = time.perf_counter()
        limit = min(self.max_wait_s, self.wait_budget_s - self.waited_s)
        while time.perf_counter() - t < limit and others_share(1.0) > self.max_foreign:
            pass
        self.waited_s += time.perf_counter() - t

    def measure(self, point: Point) -> Measured:
        """The point's quietest run, with the probes around it (`Measured.probes`): the
        pair before it and the pair `between_points` times after it."""
        before = self.last
        best: Measured | None = None
        for attempt in range(1, self.tries + 1):
            got = self.serve(point)
            got.attempts = attempt
            if best is None or got.foreign < best.foreign:
                best = got
            if not self.enabled or not self.busy(got) or self.spent:
                break
            self.retries += 1
            self.wait()
        assert best is not None
        self.between_points()
        assert self.last is not None
        if before is not None:
            best.probes = (
                (before[0] + self.last[0]) / 2,
                (before[1] + self.last[1]) / 2,
            )
        return best


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


# ---- where it ran -------------------------------------------------------------------------
def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def hardware_slug(device: torch.device, cpu: dict[str, Any]) -> str:
    """`amd-epyc-zen4`, `intel-xeon-platinum-8480-amx`, `nvidia-h200`: what a profile's file
    name says it was measured on."""
    if device.type == "cuda":
        return slug(torch.cuda.get_device_name(device))
    name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\d+-core processor", " ", cpu["cpu"], flags=re.I)
    parts = [slug(name)]
    isa = cpu["isa"]
    if cpu["microarchitecture"]:
        parts.append(cpu["microarchitecture"])
    elif isa.get("amx_bf16"):
        parts.append("amx")
    elif isa.get("avx512_bf16"):
        parts.append("avx512bf16")
    elif isa.get("avx512f"):
        parts.append("avx512")
    return "-".join(p for p in parts if p)


def model_name(cfg: DictConfig) -> str:
    if cfg.model.source == "hf":
        return slug(Path(cfg.model.path).name)
    return str(cfg.model.source)


def make_meta(
    cfg: DictConfig,
    model: Any,
    device: torch.device,
    grid: list[Point],
    command: str,
    paths: dict[str, str],
) -> dict[str, Any]:
    env = environment_tags()
    cpu = cpu_info()
    return {
        "model_id": model_id(model.config),
        "model": model_name(cfg),
        "model_source": str(cfg.model.source),
        "dtype": str(cfg.dtype),
        "device": str(device),
        "device_type": device.type,
        # `machine.cpu` as `environment_tags` names it: how a run finds the profile measured
        # on its own CPU among several shipped for one model x dtype.
        "machine": {
            **cpu,
            "gpu": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else environment_tags()["machine.gpu"],
            "threads": torch.get_num_threads(),
        },
        "kernels": paths,
        "engine": {
            "block_size": int(cfg.engine.block_size),
            # as set (auto: measured at start-up; `kernels` says what ran)
            "packed_linears": str(cfg.engine.packed_linears),
            "paged_kernel": str(cfg.engine.paged_kernel),
            "argmax_kernel": str(cfg.engine.argmax_kernel),
            "check_invariants": bool(cfg.engine.check_invariants),
        },
        "torch": str(torch.__version__),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": env.get("git.commit", "unknown"),
        "dirty": env.get("git.dirty", "unknown"),
        "command": command,
        "sampled_requests": dict(SAMPLED),
        "grid": [
            {
                "name": p.name,
                "requests": len(p.prompt_lens),
                "max_num_seqs": p.max_num_seqs,
                "prompt_lens": sorted(set(p.prompt_lens)),
                "max_output": max(p.output_lens),
                "holdout": p.holdout,
            }
            for p in grid
        ],
    }


# ---- the run ------------------------------------------------------------------------------
def calibrate(
    overrides: list[str],
    grid: list[Point],
    *,
    passes: int = 1,
    max_foreign: float = 0.05,
    max_wait_s: float = 60.0,
    wait_budget_s: float = 120.0,
    gated: bool = True,
    drift: str = "probes",
    command: str = "",
    log: Callable[[str], None] = print,
) -> tuple[MeasuredProfile, list[Measured], DictConfig]:
    """Load the model, warm it, measure every grid point `passes` times (the second pass in
    reverse order, so that a slow drift falls on every point alike), fit. `drift="probes"`
    fits each run's steps as the grid's median state would have run them (`at_reference`);
    `"none"` fits the seconds as measured."""
    if drift not in DRIFT:
        raise ValueError(f"--drift={drift}: must be one of {', '.join(DRIFT)}")
    base = compose_cfg(overrides)
    if base.executor.name != "model":
        raise ValueError(f"executor={base.executor.name}: calibration measures the real model")
    check_before_loading(base)
    if base.threads:
        torch.set_num_threads(int(base.threads))
    torch.manual_seed(base.seed)
    t0 = time.perf_counter()
    loaded = load(base)
    model, _, device, _ = loaded

    def serve(p: Point) -> Measured:
        return serve_point(overrides, loaded, p, base.seed)

    # Untimed: the kernels built and loaded, oneDNN's first shapes, the allocator warm.
    for p in (
        decode(2, 24, 4),
        mixed(3, 40),
        decode(8, 8, 3, sampled=True),
        CANARY,
        PREFILL_CANARY,
    ):
        serve(p)
    readback = readback_seconds(device)
    gate = Gate(serve, max_foreign, max_wait_s, wait_budget_s, enabled=gated)
    canary_start = gate.canary()
    order = [p for k in range(passes) for p in (grid if k % 2 == 0 else grid[::-1])]
    runs: list[Measured] = []
    for i, p in enumerate(order, 1):
        got = gate.measure(p)
        runs.append(got)
        fwd = sum(s[1] for s in got.steps)
        log(
            f"[{i:2d}/{len(order)}] {p.name:16s} {'holdout' if p.holdout else 'fit':7s} "
            f"{len(got.steps):3d} steps  wall {got.wall_s:6.2f} s  forward {fwd:6.2f} s  "
            f"others' CPU {got.foreign:4.0%}"
            + (f"  ({got.attempts} tries)" if got.attempts > 1 else "")
        )
    paths = runs[0].extra
    canary_end = gate.canary()
    used = clean_runs(runs, gate) if gated else runs
    measured = [at_reference(m) for m in used]  # each run's samples
    host_rows, host_s = [], []
    for m in used:
        if not m.point.holdout:
            for st in m.stats:
                host_rows.append(st.rows)
                host_s.append(host_seconds(st, readback))
    meta = make_meta(base, model, device, grid, command, paths)

    def fit(samples: list[Sample]) -> MeasuredProfile:
        return MeasuredProfile.fit(
            samples,
            meta,
            forward_terms=forward_terms(device, paths["linear"].startswith("onednn")),
            sample_terms=SAMPLE_TERMS,
            prepare_terms=PREPARE_TERMS,
            holdout=[p.name for p in grid if p.holdout],
            readback_s=readback,
            host=fit_host(host_rows, host_s),
        )

    profile = fit([s for run in measured for s in run])
    reference = (statistics.median(gate.grid_canaries), statistics.median(gate.grid_prefills))
    spread = {"measured": pass_spread(used, measured)}
    if drift == "probes":
        # The first fit's shape splits each step into the seconds that go with memory
        # bandwidth and those that go with arithmetic; each part is taken to the grid's
        # median state by its own probe, and the profile is fitted again on the result.
        steady = [at_reference(m, reference, profile.forward) for m in used]
        spread["steadied"] = pass_spread(used, steady)
        as_measured = profile.fit_report
        profile = fit([s for run in steady for s in run])
        for k in ("mape", "p90", "run_mape", "run_max"):
            key = f"forward_holdout_{k}"
            if key in as_measured:
                profile.fit_report[f"measured_{key}"] = as_measured[key]
    held = [host_seconds(st, readback) for m in used if m.point.holdout for st in m.stats]
    pred = [profile.host.seconds(st.rows) for m in used if m.point.holdout for st in m.stats]
    if held:
        profile.fit_report["host_holdout_total_error"] = round(
            sum(pred) / max(sum(held), 1e-9) - 1, 5
        )
    report = profile.fit_report
    report["passes"] = passes
    report["drift"] = drift
    # How far a point's two passes disagreed (summed forward seconds, the median over the
    # points measured twice), as measured and as fitted: what the drift correction removed.
    for k, v in spread.items():
        if v is not None:
            report[f"pass_spread_{k}"] = round(v, 5)
    report["others_cpu_share_mean"] = round(statistics.mean(m.foreign for m in runs), 4)
    # A 1-row decode step (the canary's median) before and after: the machine's drift.
    report["canary_start_s"] = round(canary_start, 5)
    report["canary_end_s"] = round(canary_end, 5)
    # The quietest probes (the reference of profiles older than the grid medians below).
    report["canary_best_s"] = round(gate.best_canary, 5)
    report["prefill_canary_best_s"] = round(gate.best_prefill, 5)
    # The probes' medians over the grid (one pair after each point): the state the fit
    # describes, which sim_check --speed auto compares its own medians with.
    report["canary_grid_s"] = round(statistics.median(gate.grid_canaries), 5)
    report["prefill_canary_grid_s"] = round(statistics.median(gate.grid_prefills), 5)
    report["remeasured_points"] = gate.retries
    report["runs_left_out"] = len(runs) - len(used)
    report["waited_s"] = round(gate.waited_s, 1)
    profile.fit_report["calibration_s"] = round(time.perf_counter() - t0, 1)
    return profile, runs, base


# ---- the machine's drift -------------------------------------------------------------------
DRIFT = ("probes", "none")


def at_reference(
    m: Measured,
    reference: tuple[float, float] | None = None,
    shape: LinearCost | None = None,
) -> list[Sample]:
    """A run's steps as samples to fit: as measured, or (given the grid's median probes and
    a first fit's `shape`) as the machine would have run them in that median state.

    A shared VM's speed wanders for minutes at a time, and not the same way for memory
    bandwidth as for arithmetic. On the Zen 5 VM (2026-12-03) a point's two passes, minutes
    apart, differed by -20% to +25% in summed forward seconds: the small decode points
    measured first and last ran 10-25% slower in the second pass, the long prompts measured
    in the middle 8-20% faster. So which point fell in which spell priced small prefills
    against large ones, and every later simulation with them (docs/simulator-validation.md).
    The run's probes (`Measured.probes`) say how slow the machine ran then: a step's
    memory-bound seconds are divided by the decode probe's ratio to `reference`, its
    compute-bound seconds (`LinearCost.split`) by the prefill probe's, as the simulator's
    `executor.speed` and `executor.compute_speed` divide them; sampling by the decode
    probe's."""
    if reference is None or shape is None or m.probes is None:
        return [Sample(f, fw, sm, m.point.name, prep) for f, fw, sm, prep in m.steps]
    decode = m.probes[0] / reference[0]
    compute = m.probes[1] / reference[1]
    out = []
    for f, fw, sm, prep in m.steps:
        total, comp = shape.split(f)
        share = comp / total if total > 0 else 0.0
        slow = (1 - share) * decode + share * compute
        out.append(Sample(f, fw / slow, sm / decode, m.point.name, prep))
    return out


def pass_spread(runs: list[Measured], samples: list[list[Sample]]) -> float | None:
    """The median over the points measured more than once of (max - min) / min of their
    runs' summed forward seconds (`samples`: each run's, in the runs' order); None when no
    point was measured twice."""
    sums: dict[str, list[float]] = {}
    for m, run in zip(runs, samples, strict=True):
        sums.setdefault(m.point.name, []).append(sum(s.forward_s for s in run))
    spreads = [(max(v) - min(v)) / min(v) for v in sums.values() if len(v) > 1 and min(v) > 0]
    return statistics.median(spreads) if spreads else None


def clean_runs(runs: list[Measured], gate: Gate) -> list[Measured]:
    """The runs of each point that other processes left alone; a point with none keeps its
    quietest run. Others' work only ever slows a step down, so its runs would bias every
    coefficient upward."""
    by: dict[str, list[Measured]] = {}
    for m in runs:
        by.setdefault(m.point.name, []).append(m)
    kept: set[int] = set()
    for group in by.values():
        quiet = [m for m in group if not gate.busy(m)]
        kept |= {id(m) for m in quiet or [min(group, key=lambda m: m.foreign)]}
    return [m for m in runs if id(m) in kept]


def default_out(cfg: DictConfig, device: torch.device) -> Path:
    name = f"{model_name(cfg)}-{cfg.dtype}-{hardware_slug(device, cpu_info())}.yaml"
    return ROOT / "outputs" / "calibrate" / name


def write_raw(path: Path, runs: Iterable[Measured]) -> None:
    """Every timed step, for refitting by hand: the point, its features and seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        names = list(StepFeatures.__dataclass_fields__)
        head = [
            "point",
            "holdout",
            "run",
            "others_cpu",
            "probe_decode_s",
            "probe_prefill_s",
            *names,
        ]
        w.writerow([*head, "forward_s", "sample_s", "prepare_s", "host_s", "transfers"])
        for i, m in enumerate(runs):
            for (feat, fw, sm, prep), st in zip(m.steps, m.stats, strict=True):
                host = sum(st.phase_s.get(p, 0.0) for p in HOST_PHASES)
                w.writerow(
                    [
                        m.point.name,
                        m.point.holdout,
                        i,
                        round(m.foreign, 4),
                        *(m.probes or ("", "")),
                        *feat.as_dict().values(),
                        fw,
                        sm,
                        prep,
                        host,
                        st.transfers,
                    ]
                )


def report(profile: MeasuredProfile) -> str:
    r = profile.fit_report
    m = profile.meta
    lines = [
        f"profile for {m['model']} ({m['model_id']}), {m['dtype']} on {m['device']} "
        f"({m['machine']['cpu']}, {m['machine']['threads']} threads)",
        f"fitted on {r['points']} steps of {r['groups']} grid points; held out "
        f"{r['holdout_points']} steps of {r['holdout_groups']}",
    ]
    for name in ("forward", "sample"):
        for split in ("train", "holdout"):
            k = f"{name}_{split}_"
            if f"{k}mape" in r:
                lines.append(
                    f"  {name:7s} {split:7s}: per step MAPE {r[k + 'mape']:.1%} "
                    f"(p90 {r[k + 'p90']:.1%}, max {r[k + 'max']:.1%}); per run "
                    f"{r[k + 'run_mape']:.1%} (max {r[k + 'run_max']:.1%}, median "
                    f"{r[k + 'run_bias']:+.1%})"
                )
    if "measured_forward_holdout_mape" in r:
        lines.append(
            f"  forward holdout, fitted as measured (--drift none): per step MAPE "
            f"{r['measured_forward_holdout_mape']:.1%}; "
            f"per run {r['measured_forward_holdout_run_mape']:.1%}"
        )
    if "pass_spread_measured" in r:
        lines.append(
            f"  a point's passes apart (median): {r['pass_spread_measured']:.1%} as measured"
            + (
                f", {r['pass_spread_steadied']:.1%} at the grid's median state (--drift probes)"
                if "pass_spread_steadied" in r
                else ""
            )
        )
    for name in ("host", "prepare"):
        if f"{name}_holdout_total_error" in r:
            lines.append(
                f"  {name:7s} holdout: total error {r[f'{name}_holdout_total_error']:+.1%}"
            )
    f = profile.forward
    terms = ", ".join(f"{t} {c:.3g}" for t, c in f.per.items())
    lines.append(
        f"forward: {f.intercept_s * 1e3:.2f} ms + {terms} (s per unit); the relative fit "
        f"scaled by {r['forward_scale']:.3f} (sample {r['sample_scale']:.3f}) to the runs' sums"
    )
    s = profile.sample
    lines.append(
        f"sample: {s.intercept_s * 1e6:.1f} us + "
        + ", ".join(f"{t} {c * 1e6:.2f} us" for t, c in s.per.items())
    )
    lines.append(
        f"host: {profile.host.per_step_s * 1e6:.0f} us/step + {profile.host.per_row_s * 1e6:.1f} "
        f"us/row; readback {profile.readback_s * 1e6:.1f} us"
    )
    p = profile.prepare
    lines.append(
        f"prepare: {p.intercept_s * 1e6:.1f} us + "
        + ", ".join(f"{t} {c * 1e6:.3f} us" for t, c in p.per.items())
    )
    lines.append(
        f"calibration: {r.get('calibration_s')} s, {r.get('passes')} passes; others' CPU "
        f"{r.get('others_cpu_share_mean', 0):.1%}, {r.get('remeasured_points')} points measured "
        f"again, {r.get('waited_s')} s waited; canary {r.get('canary_start_s', 0) * 1e3:.1f} -> "
        f"{r.get('canary_end_s', 0) * 1e3:.1f} ms"
    )
    return "\n".join(lines)


def log_mlflow(
    cfg: DictConfig, args: argparse.Namespace, profile: MeasuredProfile, files: list[Path]
) -> None:
    from framework.tracking.store import TrackingStore
    from framework.tracking.tags import flatten

    store = TrackingStore(cfg.mlflow)
    kind = "calibration"
    tags = {**environment_tags(), "mlflow.source.name": "experiments/calibrate.py"}
    tags |= {
        "nanoserve.kind": kind,
        "profile.hardware": hardware_slug(
            torch.device(profile.meta["device"]), profile.meta["machine"]
        ),
    }
    run_id = store.start_run(f"calibrate {profile.meta['model']} {profile.meta['dtype']}", tags)
    if run_id is not None:
        params = flatten(OmegaConf.to_container(cfg, resolve=True), skip=["mlflow", "workload"])
        params |= {f"calibrate.{k}": str(v) for k, v in vars(args).items()}
        params |= {
            "profile.model_id": profile.meta["model_id"],
            "profile.cpu": profile.meta["machine"]["cpu"],
            "profile.gpu": str(profile.meta["machine"]["gpu"]),
        }
        store.log_params(run_id, params)
        metrics = {f"fit.{k}": v for k, v in profile.fit_report.items()}
        metrics |= {"forward.intercept_s": profile.forward.intercept_s}
        metrics |= {f"forward.{t}": c for t, c in profile.forward.per.items()}
        metrics |= {f"sample.{t}": c for t, c in profile.sample.per.items()}
        metrics |= {"prepare.intercept_s": profile.prepare.intercept_s}
        metrics |= {f"prepare.{t}": c for t, c in profile.prepare.per.items()}
        metrics |= {
            "host.per_step_s": profile.host.per_step_s,
            "host.per_row_s": profile.host.per_row_s,
            "readback_s": profile.readback_s,
        }
        store.log_summary(run_id, {k.replace(">", "_gt_"): v for k, v in metrics.items()})
        store.log_files(run_id, files)
        store.end_run(run_id)
    if store.broken is not None:
        print(f"MLflow: not logged: {store.broken}", file=sys.stderr)
    else:
        print(f"MLflow: logged run {run_id} to {store.uri}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the profile file (.yaml or .json); default outputs/calibrate/"
        "<model>-<dtype>-<hardware>.yaml",
    )
    ap.add_argument("--quick", action="store_true", help="the tiny model and a small grid")
    ap.add_argument("--raw", type=Path, default=None, help="also write every timed step (CSV)")
    ap.add_argument(
        "--max-foreign",
        type=float,
        default=0.05,
        help="measure a point again when others took more of all CPUs (0.05)",
    )
    ap.add_argument(
        "--ungated",
        action="store_true",
        help="measure every point once, whatever the machine is doing (tests)",
    )
    ap.add_argument(
        "--passes",
        type=int,
        default=None,
        help="measure the grid this many times, pooled (default 2; --quick 1)",
    )
    ap.add_argument(
        "--wait-budget",
        type=float,
        default=120.0,
        help="seconds of waiting for a quiet machine in the whole run (120); then measure on",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=60.0,
        help="seconds to wait, before measuring a point again, for the machine to quieten (60)",
    )
    ap.add_argument(
        "--drift",
        choices=DRIFT,
        default="probes",
        help="probes: fit each run's steps at the grid's median state, from the probes timed "
        "around it (default); none: as measured",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model=, dtype=, device=, ...)")
    return ap.parse_args(argv)


def run(args: argparse.Namespace, command: str = "") -> tuple[MeasuredProfile, Path]:
    """Calibrate, write the profile, report, log: (the profile, where it was written)."""
    overrides = [*(["model=tiny"] if args.quick else []), *args.overrides]
    on_cuda = resolve_device(str(compose_cfg(overrides).device)).type == "cuda"
    grid = quick_grid() if args.quick else cuda_grid() if on_cuda else full_grid()
    threads = torch.get_num_threads()
    try:
        profile, runs, cfg = calibrate(
            overrides,
            grid,
            passes=args.passes or (1 if args.quick else 2),
            max_foreign=args.max_foreign,
            max_wait_s=args.max_wait,
            wait_budget_s=args.wait_budget,
            gated=not args.ungated,
            drift=args.drift,
            command=command,
        )
    finally:
        torch.set_num_threads(threads)  # a caller in the same process keeps its setting
    out = args.out or default_out(cfg, torch.device(profile.meta["device"]))
    profile.write(out)
    profile.source = str(out)
    with tempfile.TemporaryDirectory() as tmp:
        raw = args.raw or Path(tmp) / "calibration_steps.csv"
        write_raw(raw, runs)
        print(report(profile))
        print(f"profile written to {out}")
        log_mlflow(cfg, args, profile, [out, raw])
    return profile, out


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    command = " ".join(
        ["python -m experiments.calibrate", *(sys.argv[1:] if argv is None else argv)]
    )
    try:
        return run(args, command)[1]
    except ValueError as err:
        sys.exit(f"experiments.calibrate: {err}")


if __name__ == "__main__":
    main()
