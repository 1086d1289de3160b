"""The systems the benchmark serves a workload through: nanoserve under one policy, one of
Hugging Face's serving paths (`peers.py`), or a server over HTTP (`http_peers.py`: nanoserve's
`serve.py` and llama.cpp's `llama-server`), each returning what it did as a `Served`."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from omegaconf import DictConfig

from experiments.bench.http_peers import HTTP_SYSTEMS, LLAMA, SERVE, SERVE_THREAD, expand
from experiments.bench.peers import Served, hf_cb, hf_static
from experiments.toolkit.config import REFERENCE, Combo, combo_overrides
from experiments.toolkit.engine import Context
from experiments.toolkit.workloads import fixed_specs
from framework.core.request import RequestSpec
from framework.run.app import build_engine
from framework.run.compose import compose_cfg
from framework.run.in_process import NullHooks
from framework.run.summary import summarize

PEERS = ("hf_static", "hf_cb", LLAMA, SERVE, SERVE_THREAD)  # what --peers may name
# The peers a plain run serves: llama.cpp is built from source (minutes) and only on request.
DEFAULT_PEERS = ("hf_static", "hf_cb")
RATIO_PEERS = ("hf_static", "hf_cb", LLAMA)  # each row's tokens/s is divided by theirs
System = tuple[str, Combo | None]  # (system, nanoserve's policy; None for a peer)


def combo_cfg(overrides: list[str], combo: Combo) -> DictConfig:
    return compose_cfg(combo_overrides(overrides, combo))


def run_nanoserve(ctx: Context, combo: Combo, specs: list[RequestSpec]) -> Served:
    cfg = combo_cfg(ctx.overrides, combo)
    engine = build_engine(cfg, ctx.model, ctx.device, ctx.dtype, NullHooks())
    result = engine.run(specs, ctx.tok.eos_token_id)
    done = [s for s in result.seqs if s.finished_at is not None]
    return Served(
        outputs={s.id: list(s.output_token_ids) for s in result.seqs},
        arrival={s.id: s.arrival for s in result.seqs},
        first={s.id: s.first_token_at for s in done if s.first_token_at is not None},
        finish={s.id: s.finished_at for s in done},
        wall_s=summarize(result)["makespan_s"],
        steps=result.steps,
    )


def run_peer(ctx: Context, name: str, specs: list[RequestSpec]) -> Served:
    e = ctx.cfg.engine
    if name in HTTP_SYSTEMS:
        if ctx.http is None:
            raise RuntimeError(f"{name}: the benchmark started no HTTP servers")
        return ctx.http.serve(name, specs)  # type: ignore[no-any-return]
    if name == "hf_static":
        return hf_static(ctx.model, specs, e.max_num_seqs, ctx.pad)
    return hf_cb(ctx.model, specs, e.max_num_seqs, e.max_num_batched_tokens, ctx.pad)


def run_same(ctx: Context, args: argparse.Namespace, n: int) -> tuple[list[RequestSpec], Any]:
    """`n` requests of the probe's prompt and output length through the reference engine,
    with room for all `n` in one batch (the probe's largest batch may exceed the runs')."""
    specs = fixed_specs(ctx.tok, [args.probe_prompt] * n, [args.probe_steps + 1] * n, 0)
    per_row = -(-(args.probe_prompt + args.probe_steps + 1) // ctx.cfg.engine.block_size)
    room = [f"engine.max_num_seqs={n}", f"engine.num_blocks={n * per_row}"]
    wide = dataclasses.replace(ctx, overrides=[*ctx.overrides, *room])
    return specs, run_nanoserve(wide, REFERENCE, specs).steps


def plan(args: argparse.Namespace) -> list[System]:
    """(system, combo) per run of one workload, nanoserve's reference first."""
    combos = [(s, a, o) for s in args.schedulers for a in args.allocators for o in args.outputs]
    combos = [REFERENCE, *(c for c in combos if c != REFERENCE)]
    return [("nanoserve", c) for c in combos] + [(p, None) for p in expand(args.peers)]


def serve(ctx: Context, system: str, combo: Combo | None, specs: list[RequestSpec]) -> Served:
    return run_nanoserve(ctx, combo, specs) if combo else run_peer(ctx, system, specs)
