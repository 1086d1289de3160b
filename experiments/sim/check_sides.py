"""The two sides of a simulator check: the real engine on the loaded model, and the
simulated one built from the same config, replaying the real run's tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from omegaconf import DictConfig

from experiments.sim.check_cases import Case
from experiments.toolkit.engine import Context
from framework.core.request import RequestSpec
from framework.engine.loop import RunResult
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.tokens import TokenStreams
from framework.run.app import build_engine
from framework.run.compose import compose_cfg
from framework.run.in_process import NullHooks
from framework.run.summary import summarize


@dataclasses.dataclass
class Runs:
    """A case's real runs and its simulated one."""

    case: Case
    specs: list[RequestSpec]
    real: list[RunResult] = dataclasses.field(default_factory=list)
    foreign: list[float] = dataclasses.field(default_factory=list)  # others' CPU, per real run
    slow: list[float] = dataclasses.field(default_factory=list)  # the canaries around each
    prefill_slow: list[float] = dataclasses.field(default_factory=list)  # the prefill probes
    retried: int = 0  # real runs measured again because others took the CPUs meanwhile
    sim: RunResult | None = None
    features: list[StepFeatures] = dataclasses.field(default_factory=list)  # the sim's steps
    # Other simulations of the same runs, by what the report calls them: at a `--speed`
    # other than 1, the profile as shipped; under `auto`, the one-scalar correction too.
    alts: dict[str, RunResult] = dataclasses.field(default_factory=dict)

    def median_real(self) -> RunResult:
        """The real run of median makespan: its counts and steps stand for the real side."""
        ranked = sorted(self.real, key=lambda r: summarize(r)["makespan_s"])
        return ranked[(len(ranked) - 1) // 2]


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the overrides of both sides, the simulator's own `executor.*` ones): the real
    executor refuses the simulator's settings rather than ignore them."""
    sim = [o for o in overrides if o.lstrip("+~").startswith("executor.")]
    bad = [o for o in overrides if o.lstrip("+~").startswith("executor=")]
    if bad:
        raise ValueError(f"{bad[0]}: the real side is the model and the other the simulator")
    return [o for o in overrides if o not in sim], sim


def sim_overrides(sim: list[str], profile: str | None, host_time: str | None) -> list[str]:
    """The simulated side's overrides: `--profile` and `--host-time` after the user's own
    `executor.*` ones, which they override when given."""
    out = ["executor=simulated", *sim]
    if profile:
        out.append(f"executor.profile={profile}")
    return [*out, f"executor.host_time={host_time}"] if host_time else out


@dataclasses.dataclass
class Setup:
    """What every run shares: the loaded model, its simulated shape, the simulator's
    settings (the profile resolved to its file)."""

    ctx: Context
    shape: Any  # ModelShape: the model's config and EOS, no weights
    sim: list[str]  # the simulated side's overrides, after the shared ones

    def real_cfg(self, case: Case) -> DictConfig:
        return compose_cfg(case.overrides(self.ctx.overrides))

    def sim_cfg(self, case: Case, extra: list[str] | None = None) -> DictConfig:
        return compose_cfg(case.overrides([*self.ctx.overrides, *self.sim, *(extra or [])]))


def serve_real(setup: Setup, case: Case, specs: list[RequestSpec]) -> RunResult:
    c = setup.ctx
    engine = build_engine(setup.real_cfg(case), c.model, c.device, c.dtype, NullHooks())
    return engine.run(specs, c.tok.eos_token_id)


class FeatureRecorder:
    """The simulated executor, each step's features kept (for the per-step table). Its own
    work, like the prediction's, is outside the virtual clock, which is frozen during the
    call, so recording costs the simulated run nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads_slots = getattr(inner, "reads_slots", True)
        self.features: list[StepFeatures] = []

    def describe(self) -> dict[str, str]:
        return dict(self.inner.describe())

    def execute(self, batch: Any) -> Any:
        self.features.append(StepFeatures.of(batch))
        return self.inner.execute(batch)


def serve_sim(
    setup: Setup,
    case: Case,
    specs: list[RequestSpec],
    replay: dict[str, list[int]] | None,
    speed: float = 1.0,
    compute_speed: float | None = None,
) -> tuple[RunResult, list[StepFeatures]]:
    """The simulated engine of the same config (at `executor.speed=speed` and
    `executor.compute_speed`), and each step's features; with `replay`, the given tokens by
    request."""
    # An override, not an assignment: a composed config can share nodes with the next one
    # composed from the same overrides, so setting a field would leak into later runs.
    extra = [f"executor.speed={speed!r}"] if speed != 1 else []
    if compute_speed is not None:
        extra.append(f"executor.compute_speed={compute_speed!r}")
    cfg = setup.sim_cfg(case, extra)
    engine = build_engine(cfg, setup.shape, torch.device("cpu"), setup.ctx.dtype, NullHooks())
    if replay is not None:
        x = cfg.executor
        streams = TokenStreams(
            setup.shape.config.vocab_size,
            setup.shape.eos_token_id,
            replay,
            float(x.mean_output_tokens),
        )
        streams.check_covers([s.id for s in specs])
        engine.executor.tokens = streams
    recorder = FeatureRecorder(engine.executor)
    engine.executor = recorder
    return engine.run(specs, setup.ctx.tok.eos_token_id), recorder.features


def makespan(result: RunResult) -> float:
    return float(summarize(result)["makespan_s"])
