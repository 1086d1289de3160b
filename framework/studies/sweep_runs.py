"""A finished sweep's jobs as records, and the refusal to compare runs that did different
work: the runs of one comparison group must have produced the same tokens, up to a genuine
greedy tie on a real model (`framework.run.greedy_check`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.tracking.plots import read_csv
from framework.tracking.run_files import read_text, run_file
from framework.tracking.tables import job_folders


class DifferentWork(RuntimeError):
    """Two runs of one comparison group produced different tokens for a request."""


@dataclass
class RunRecord:
    """What one finished job of a sweep left in its folder."""

    folder: Path
    config: DictConfig  # config.yaml: the resolved run config
    metrics: dict[str, Any]
    outputs: dict[str, list[int]]  # request id -> output token ids
    requests: list[dict[str, str]]
    steps: list[dict[str, str]]
    prompts: dict[str, list[int]] = field(default_factory=dict)  # request id -> prompt ids


def load_run(folder: Path) -> RunRecord:
    outputs, prompts = {}, {}
    for line in read_text(run_file(folder, "outputs.jsonl")).splitlines():
        o = json.loads(line)
        outputs[o["id"]] = o["output_token_ids"]
        prompts[o["id"]] = o.get("prompt_token_ids", [])
    config = OmegaConf.load(folder / "config.yaml")
    assert isinstance(config, DictConfig)  # a run's composed config is a mapping
    return RunRecord(
        folder=folder,
        config=config,
        metrics=json.loads((folder / "metrics.json").read_text()),
        outputs=outputs,
        requests=read_csv(folder / "requests.csv"),
        steps=read_csv(run_file(folder, "steps.csv")),
        prompts=prompts,
    )


def load_sweep(sweep_dir: Path) -> list[RunRecord]:
    """Every job folder of a sweep (those with a `.hydra` folder), in job order. A job
    without results (it failed) stops the study: a table with a hole would mislead."""
    jobs = job_folders(sweep_dir)
    missing = [p.name for p in jobs if not (p / "metrics.json").is_file()]
    if missing or not jobs:
        raise FileNotFoundError(
            f"{sweep_dir}: jobs without results: {', '.join(missing) or 'no job folders at all'}"
        )
    return [load_run(p) for p in jobs]


# Whether two runs' outputs of one request differ only from a genuine tie on: a line saying
# where (accepted), or None (different work).
TieCheck = Callable[[RunRecord, RunRecord, str], "str | None"]


def check_same_work(
    runs: list[RunRecord],
    group: Callable[[RunRecord], Hashable],
    tie_check: TieCheck | None = None,
) -> list[str]:
    """Refuse (DifferentWork) unless the runs of each group produced the same tokens, up to
    genuine ties where `tie_check` accepts them. Returns a line per accepted tie."""
    first: dict[Hashable, RunRecord] = {}
    ties: list[str] = []
    for run in runs:
        ref = first.setdefault(group(run), run)
        if run.outputs == ref.outputs:
            continue
        ids = sorted(set(run.outputs) | set(ref.outputs))
        for diff in (i for i in ids if run.outputs.get(i) != ref.outputs.get(i)):
            tie = tie_check(run, ref, diff) if tie_check is not None else None
            if tie is not None:
                ties.append(tie)
                continue
            raise DifferentWork(
                f"not comparing different work: {run.folder} and {ref.folder} produced "
                f"different tokens for request {diff} ({len(run.outputs.get(diff, []))} vs "
                f"{len(ref.outputs.get(diff, []))} tokens); no table written"
            )
    return ties


class ModelTies:
    """The tie rule on a real model's runs: the model is loaded (once, on the first
    difference) from the runs' own config. A simulated run's tokens come from seeded
    streams, not logits: no tie to accept there."""

    def __init__(self) -> None:
        self._model: Any = None

    def __call__(self, run: RunRecord, ref: RunRecord, rid: str) -> str | None:
        from framework.run.greedy_check import compare_greedy

        cfg = run.config
        if cfg.get("executor", {}).get("name", "model") != "model" or rid not in ref.prompts:
            return None
        if self._model is None:
            from framework.run.app import load

            self._model = load(cfg)[0]
        ours, theirs = run.outputs.get(rid, []), ref.outputs.get(rid, [])
        got = compare_greedy(self._model, ref.prompts[rid], rid, ours, theirs)
        if not got.equal or got.divergence is None:
            return None
        d = got.divergence
        return (
            f"{rid}: {run.folder.name} against {ref.folder.name}, token {d.position}: {d.ours} "
            f"vs {d.ref}, logit gap {d.gap:.2g} (a tie; the rest of its output may differ)"
        )
