"""The command line as users type it: Hydra overrides in, result files out."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from framework.run.observers import run_with_observers
from tests.helpers import ROOT, make_cfg

REQUIRED_METRICS = [
    "requests",
    "requests_finished",
    "requests_rejected",
    "steps",
    "token_slots",
    "tokens_kept",
    "prefill_tokens",
    "waste_fraction",
    "occupancy",
    "preemptions",
    "recomputed_tokens",
    "peak_blocks",
    "transfers",
    "transfers_per_step",
    "makespan_s",
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "first_answer_s",
    "time_share_forward",
    "time_share_schedule",
]


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *overrides, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_writes_every_result_file(tmp_path: Path) -> None:
    proc = run_cli(
        tmp_path,
        "model=tiny",
        "scheduler=static",
        "allocator=worst_case",
        "workload=straggler",
        "engine.max_num_seqs=8",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for key in REQUIRED_METRICS:
        assert key in metrics, key
    assert metrics["token_slots"] == 256 and metrics["tokens_kept"] == 60
    with (tmp_path / "requests.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 8
    with (tmp_path / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 32 and "forward_s" in steps[0]
    outputs = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert {o["id"] for o in outputs} == {f"r{i}" for i in range(8)}
    assert all(
        set(o) >= {"id", "prompt_token_ids", "output_token_ids", "text", "finish_reason"}
        for o in outputs
    )
    assert "counts (any machine)" in proc.stdout and "times (this machine)" in proc.stdout


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "preemption.victim=random",
            "preemption.victim must be one of newest, oldest, most_blocks",
        ),
        ("device=tpu", "device must be one of auto, cpu, cuda"),
        ("dtype=int8", "dtype must be one of float32, bfloat16, float16"),
        ("engine.max_num_seqs=0", "engine.max_num_seqs must be >= 1"),
        ("engine.block_size=0", "engine.block_size must be >= 1"),
        ("engine.num_blocks=-3", "engine.num_blocks must be >= 1"),
        ("engine.max_num_batched_tokens=4", "must be >= engine.max_num_seqs"),
    ],
)
def test_bad_input_names_the_field(tmp_path: Path, override: str, expected: str) -> None:
    cfg = make_cfg("model=tiny", "workload=straggler", override)
    with pytest.raises(ValueError, match=re.escape(expected)):
        run_with_observers(cfg, tmp_path)
    assert not (tmp_path / "metrics.json").exists()


def test_unknown_scheduler_lists_the_choices(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "model=tiny", "scheduler=fifo")
    assert proc.returncode != 0
    text = proc.stderr + proc.stdout
    assert "static" in text and "continuous" in text


def test_help_lists_the_policy_groups() -> None:
    proc = subprocess.run(
        [sys.executable, "run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    for word in (
        "scheduler: continuous, priority, sjf, static",
        "allocator: incremental, worst_case",
        "preemption: priority, recompute",
        "output: adaptive, deferred, immediate",
        "workload:",
    ):
        assert word in proc.stdout, proc.stdout
