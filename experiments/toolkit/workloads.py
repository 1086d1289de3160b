"""The request sets several tools serve alike, built one way: the benchmark's queued slice of
the Azure trace is the simulator check's too, its lengths fitted as the calibration grid
fits the slice it holds out (`framework.calibration.grid.fit_lengths`), so a change to how
the slice is built reaches all three at once."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from framework.calibration.grid import fit_lengths
from framework.core.request import RequestSpec
from framework.run.compose import compose_cfg
from framework.workloads import build_workload
from framework.workloads.synthetic import sample_arrivals
from framework.workloads.trace import read_trace


def fixed_specs(tok: Any, prompts: list[int], outputs: list[int], seed: int) -> list[RequestSpec]:
    wl = {"kind": "fixed", "prompt_lens": prompts, "output_lens": outputs, "seed": seed}
    return build_workload(wl, tok)


def azure_specs(tok: Any, args: argparse.Namespace, seed: int) -> list[RequestSpec]:
    """The queued Azure slice (`cli.add_azure_slice`'s arguments): the first `--requests`
    rows of `--trace`, lengths fitted to `--max-prompt` / `--max-output`, all at t=0."""
    rows = read_trace(Path(args.trace), 0, args.requests)
    prompts = fit_lengths([r.context_tokens for r in rows], args.max_prompt, args.fit)
    outputs = fit_lengths([r.generated_tokens for r in rows], args.max_output, args.fit)
    return fixed_specs(tok, prompts, outputs, seed)


def chat_queue(tok: Any, n: int, max_tokens: int) -> list[RequestSpec]:
    """The shipped chat prompts through the chat template, cycled to `n` requests (ids
    c0..), all queued at t=0, each generating exactly `max_tokens` (EOS ignored)."""
    chat = build_workload({"kind": "chat", "max_tokens": max_tokens}, tok)
    return [
        dataclasses.replace(
            chat[i % len(chat)],
            id=f"c{i}",
            sampling=dataclasses.replace(
                chat[i % len(chat)].sampling, max_tokens=max_tokens, ignore_eos=True
            ),
        )
        for i in range(n)
    ]


def straggler_specs(overrides: list[str], tok: Any) -> list[RequestSpec]:
    """The straggler preset (`workload=straggler`) under the run's overrides."""
    cfg = compose_cfg([*overrides, "workload=straggler"])
    return build_workload(OmegaConf.to_container(cfg.workload, resolve=True), tok)


def open_loop(specs: list[RequestSpec], rate: float, seed: int) -> list[RequestSpec]:
    """The same requests, arriving as a Poisson process of `rate` per second from t=0."""
    arrivals = sample_arrivals(
        np.random.default_rng(seed), len(specs), process="poisson", rate=rate, cv=1.0
    )
    return [dataclasses.replace(s, arrival=float(a)) for s, a in zip(specs, arrivals, strict=True)]
