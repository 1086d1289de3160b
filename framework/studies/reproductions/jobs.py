"""The runs a reproduction makes: each a config of Hydra overrides on `conf/` (the
reproduction's base, the job's own, then the user's, which win), run on the engine in this
process, and returned as the flat summary `metrics.json` holds plus whatever the job measures
of the engine's result.

Why not `framework.studies.notebook.run`, which runs one config the way `python run.py` does:
a reproduction runs the same workload many times (a capacity sweep is ten runs of one trace),
and a run folder of a whole trace is most of the cost. The Mooncake conversation trace is
145 M prompt tokens: building its prompts takes seconds, its `outputs.jsonl.gz` is 430 MB to
write, and `read_run` reads every token id back into a DataFrame. So here every config is
checked first, as `python run.py` checks it (a bad override or value is the user's mistake,
one `UserError` line, before anything runs); each distinct model is loaded once and each
distinct workload built once; and each job builds its own engine over them (or its own
cluster of engines, `cluster.replicas` behind the router, as `run.py` does) and keeps only
its numbers. No observer is attached: the reproduction logs one MLflow run of its own.

Jobs run in forked worker processes when `workers` > 1 (Linux, one job per process so each
gives its memory back): the loaded model and the built workloads are read in place, never
pickled, and only each job's numbers come back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.core.request import RequestSpec
from framework.engine.loop import RunResult
from framework.plugin_host.registry import registry
from framework.run.app import build_runner, check_before_loading, load
from framework.run.compose import compose_cfg
from framework.run.errors import user_input
from framework.run.simulation import is_simulated
from framework.run.summary import summarize
from framework.run.workers import fork_map
from framework.workloads import build_workload


@dataclass(frozen=True)
class Job:
    """One run of a reproduction. `measure`, when given, reads numbers of its own from the
    engine's result (a module-level function: with workers it runs in the worker)."""

    name: str
    overrides: tuple[str, ...] = ()
    measure: Callable[[RunResult], dict[str, Any]] | None = None


@dataclass
class JobOutcome:
    """A finished job: its name, its own overrides, and its numbers (`metrics.json`'s keys,
    then the measured ones), with the wall seconds it took on this machine."""

    name: str
    overrides: list[str]
    metrics: dict[str, Any]
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "overrides": self.overrides,
            "wall_s": self.wall_s,
            "metrics": self.metrics,
        }


@dataclass
class _Plan:
    """The jobs' configs, and what they share: models by key, workloads by key. Forked
    workers read it in place (`framework.run.workers`)."""

    jobs: Sequence[Job]
    configs: list[DictConfig]
    models: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    workloads: dict[str, list[RequestSpec]] = field(default_factory=dict)


# Simulated model shapes (config and tokenizer, no weights) by key, kept for the process: a
# capacity search calls `run_jobs` once a probe, and reading the shape again is most of a
# short probe's cost. A real model's weights are loaded for each call and let go after it.
_shapes: dict[str, tuple[Any, ...]] = {}


def job_config(base: Sequence[str], job: Job, user: Sequence[str]) -> DictConfig:
    """The config of `job`: the reproduction's base, the job's overrides, the user's last."""
    return compose_cfg([*base, *job.overrides, *user])


def check_jobs(base: Sequence[str], jobs: Sequence[Job], user: Sequence[str]) -> list[DictConfig]:
    """Every job's config, each checked as `python run.py` checks one before loading: a
    mistake in the overrides raises `UserError` naming the field, before any job runs."""
    configs = []
    checked: set[str] = set()
    for job in jobs:  # each checked as it is composed: a mistake stops at the first job
        cfg = job_config(base, job, user)
        text = OmegaConf.to_yaml(cfg)
        if text not in checked:
            with user_input():
                check_before_loading(cfg)
            checked.add(text)
        configs.append(cfg)
    return configs


def run_jobs(
    base: Sequence[str], jobs: Sequence[Job], user: Sequence[str] = (), workers: int = 1
) -> list[JobOutcome]:
    """Run `jobs` (in order of the list returned), `workers` at a time where forking is
    possible; a user's mistake raises `UserError` before the first one starts."""
    configs = check_jobs(base, jobs, user)
    plan = _Plan(jobs, configs)
    with user_input():  # a model folder or trace the checks passed but cannot be read
        for cfg in configs:
            mkey = _model_key(cfg)
            if mkey not in plan.models:
                plan.models[mkey] = _shapes.get(mkey) or load(cfg)
                if is_simulated(cfg):
                    _shapes[mkey] = plan.models[mkey]
            wkey = _workload_key(cfg)
            if wkey not in plan.workloads:
                tokenizer = plan.models[mkey][1]
                container = OmegaConf.to_container(cfg.workload, resolve=True)
                plan.workloads[wkey] = build_workload(container, tokenizer)
    return list(fork_map(lambda index: _run(plan, index), range(len(jobs)), workers, fresh=True))


def _run(plan: _Plan, index: int) -> JobOutcome:
    """Job `index` of the plan: its engine, or its cluster of them (`cluster.replicas`,
    disaggregated by `cluster.roles` as in `run.py`), over the shared model and workload."""
    job, cfg = plan.jobs[index], plan.configs[index]
    model, tokenizer, device, dtype = plan.models[_model_key(cfg)]
    specs = plan.workloads[_workload_key(cfg)]
    began = time.perf_counter()
    runner = build_runner(cfg, model, device, dtype, registry().pm.hook, say=False)
    result = runner.run(specs, tokenizer.eos_token_id)
    metrics = summarize(result)
    if job.measure is not None:
        metrics |= job.measure(result)
    return JobOutcome(job.name, list(job.overrides), metrics, time.perf_counter() - began)


def _model_key(cfg: DictConfig) -> str:
    """What `load` reads: the model, the dtype, the device and whether it is simulated."""
    return "\n".join([OmegaConf.to_yaml(cfg.model), str(cfg.dtype), str(cfg.device)]) + str(
        cfg.executor.name
    )


def _workload_key(cfg: DictConfig) -> str:
    return _model_key(cfg) + OmegaConf.to_yaml(cfg.workload, resolve=True)
