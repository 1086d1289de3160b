"""A sweep on a real SLURM cluster through `hydra/launcher=slurm` (submitit): both jobs ran
as SLURM array tasks, finished, and nest under one MLflow parent run.

Skipped unless `sinfo` answers with a node that is up: CI has no SLURM. docs/scale-out.md
shows the single-node slurmctld + slurmd setup this was run against.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
SWEEP_TIMEOUT_S = 420


def slurm_is_up() -> bool:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return False
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return False
    states = proc.stdout.split()
    return proc.returncode == 0 and any(s.rstrip("*") in ("idle", "mixed") for s in states)


@pytest.mark.skipif(not slurm_is_up(), reason="no SLURM cluster answers (sinfo)")
def test_a_sweep_on_slurm_is_one_parent_with_a_child_per_job(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "multirun"  # on a real cluster: a folder every node shares
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}  # sbatch exports it to the jobs
    env.pop("NANOSERVE_MLFLOW_PARENT", None)
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "hydra/launcher=slurm",
         "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
         "hydra.launcher.timeout_min=10", "model=tiny", "workload=straggler",
         "scheduler=static,continuous", "observers=[console,mlflow]", "mlflow.experiment=slurm",
         f"hydra.sweep.dir={sweep}", "threads=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # Both jobs ran to the end, each as a task of one SLURM array job (`<array id>_<task>`).
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    for job in jobs:
        summary = (job / "metrics.json").read_text()
        assert '"incomplete": false' in summary, summary[:500]
        hydra_yaml = (job / ".hydra" / "hydra.yaml").read_text()
        assert re.search(rf"id: '?\d+_{job.name}'?\n", hydra_yaml), hydra_yaml[:2000]

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("slurm")
    assert exp is not None, f"no experiment 'slurm' in {uri}"
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    (parent,) = parents
    assert parent.info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1 == 2
    assert sorted(c.info.run_name for c in children) == ["scheduler=continuous", "scheduler=static"]
    assert all(c.info.status == "FINISHED" for c in children)
