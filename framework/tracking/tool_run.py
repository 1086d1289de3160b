"""One tool run (`python -m experiments.<tool>`: a calibration, a benchmark, a check) logged
to MLflow, the same way for every tool: the run config and the tool's arguments as params, its
headline numbers as metrics, its files as artifacts, and child runs where a tool has parts
worth finding on their own. A failing store costs nothing: the files are already written,
and one line says where. Also the command as typed, which a tool's files quote."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from framework.tracking.store import TrackingStore
from framework.tracking.tags import environment_tags, flatten


def command_line(tool: str, argv: list[str] | None) -> str:
    """The command as typed, for a report's header or a file's provenance."""
    return " ".join([f"python -m experiments.{tool}", *(sys.argv[1:] if argv is None else argv)])


@dataclasses.dataclass
class ChildRun:
    """A part of a tool's run (a case of a check), logged under it."""

    name: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]


def log_run(
    cfg: DictConfig,
    args: argparse.Namespace,
    files: Sequence[Path],
    metrics: dict[str, float],
    *,
    tool: str,
    kind: str | None = None,
    name: str | None = None,
    tags: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    children: Sequence[ChildRun] = (),
) -> None:
    """One MLflow run of `python -m experiments.<tool>`, tagged `nanoserve.kind=<kind>`
    (the tool's name unless given) and named `name` (the kind unless given). The arguments
    go in as `<tool>.<arg>` params, after the run config's; `params` and `tags` add to them."""
    kind = kind or tool
    store = TrackingStore(cfg.mlflow)
    source = {**environment_tags(), "mlflow.source.name": f"experiments/{tool}.py"}
    run_id = store.start_run(name or kind, source | {"nanoserve.kind": kind} | (tags or {}))
    if run_id is not None:
        logged = flatten(OmegaConf.to_container(cfg, resolve=True), skip=["mlflow", "workload"])
        logged |= {f"{tool}.{k}": str(v) for k, v in vars(args).items()}
        store.log_params(run_id, logged | (params or {}))
        store.log_summary(run_id, metrics)
        store.log_files(run_id, files)
        for child in children:
            child_id = store.start_run(child.name, source | child.tags, parent=run_id)
            if child_id is None:
                break
            store.log_params(child_id, child.params)
            store.log_summary(child_id, child.metrics)
            store.end_run(child_id)
        store.end_run(run_id)
    if store.broken is not None:
        where = f"results are in {files[0].parent}"
        print(f"MLflow: not logged: {store.broken}; {where}", file=sys.stderr)
    else:
        print(f"MLflow: logged run {run_id} to {store.uri}")
