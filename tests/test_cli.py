"""The command line as users type it: Hydra overrides in, result files out."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, assert_refused, cli

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
    # The run was logged by the MLflow helper process (a single run, mlflow not imported
    # before it started: framework/tracking/background.py), whole.
    assert "MLflow: logged run" in proc.stdout, proc.stdout[-2000:]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs(
        [client.get_experiment_by_name("nanoserve").experiment_id],
        filter_string=f"tags.`nanoserve.output_dir` = '{tmp_path.resolve()}'",
    )
    assert run.info.status == "FINISHED" and run.data.metrics["token_slots"] == 256
    assert run.data.params["scheduler.name"] == "static"
    assert {"steps.csv", "metrics.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


# Each case is a whole command line composed by Hydra (about a second). The refusals of
# preemption.victim=random, device=tpu, dtype=int8, engine.max_num_seqs=0 and
# engine.block_size=0 are checked by tests/test_reliability.py's
# test_bad_input_is_refused_before_any_work through the same command line, with longer
# messages, so they are not repeated here.
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("engine.num_blocks=-3", "engine.num_blocks must be >= 1"),
        ("engine.max_num_batched_tokens=4", "must be >= engine.max_num_seqs"),
        ("engine.packed_linears=maybe", "engine.packed_linears must be auto (chosen by a"),
        ("engine.paged_kernel=2", "engine.paged_kernel must be auto (chosen by a"),
        ("engine.argmax_kernel=no", "engine.argmax_kernel must be auto (chosen by a"),
        ("engine.layer_glue=no", "engine.layer_glue must be auto (measured on CPU, compiled on"),
        ("engine.cuda_graphs=on", "engine.cuda_graphs must be auto (captured on CUDA"),
        ("print_limit=-1", "print_limit must be >= 0 (or null: every answer)"),
        ("mlflow.max_step_points=1", "mlflow.max_step_points must be >= 2"),
        ("mlflow.max_artifact_mb=-1", "mlflow.max_artifact_mb must be >= 0 (or null: every"),
        ("results.compress=maybe", "results.compress must be auto, true or false"),
    ],
)
def test_bad_input_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str
) -> None:
    status, _, err = cli(
        capsys, "model=tiny", "workload=straggler", override, f"hydra.run.dir={tmp_path}"
    )
    assert_refused(status, err, expected)
    assert not (tmp_path / "metrics.json").exists()


def test_the_console_prints_the_first_answers_and_says_where_the_rest_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = cli(
        capsys,
        "model=tiny",
        "workload=straggler",
        "print_limit=2",
        "observers=[console]",
        f"hydra.run.dir={tmp_path}",
    )
    assert status == 0
    assert "r1" in out and "r2 " not in out and "r7" not in out
    assert "... and 6 more answers in" in " ".join(out.split())  # rich wraps long lines
    assert len((tmp_path / "outputs.jsonl").read_text().splitlines()) == 8  # all kept


def test_unknown_scheduler_is_one_line_listing_the_choices(tmp_path: Path) -> None:
    """As a user meets it, in a fresh process: exit 2, one line, no traceback."""
    proc = run_cli(tmp_path, "model=tiny", "scheduler=fifo")
    assert_refused(proc.returncode, proc.stderr, "unknown policy scheduler=fifo; scheduler offers")
    assert "static (nanoserve)" in proc.stderr and "continuous (nanoserve)" in proc.stderr


def test_help_teaches_the_commands_and_lists_only_real_choices() -> None:
    proc = subprocess.run(
        [sys.executable, "run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("nanoserve: an LLM inference engine")
    for command in ("python run.py -m ", "+experiment=", "mlflow ui"):
        assert command in text
    assert "_schema" not in text  # config-store entries are not choices
    groups = choice_groups(text)
    assert set(groups["scheduler"]) == {
        "chunked",
        "continuous",
        "lpm",
        "prefill_first",
        "priority",
        "sjf",
        "static",
    }
    assert set(groups["allocator"]) == {"incremental", "prefix_cache", "worst_case"}
    assert set(groups["preemption"]) == {"priority", "recompute"}
    assert set(groups["output"]) == {"adaptive", "deferred", "immediate"}
    assert set(groups["model"]) == {"hf", "smollm2", "tiny"}
    assert set(groups["router"]) == {
        "least_outstanding", "least_tokens", "power_of_two", "prefix_aware", "random",
        "round_robin",
    }  # fmt: skip
    assert {
        "arxiv_poisson",
        "azure_conv_poisson",
        "chat",
        "fixed",
        "jsonl",
        "mooncake",
        "mooncake_slice",
        "multiturn",
        "shared_prefix",
        "straggler",
        "synthetic",
        "system_prompts",
        "trace",
    } == set(groups["workload"])
    assert {"batching", "allocation", "deferral", "trace"} <= set(groups["experiment"])
    assert {"basic", "parallel", "slurm", "ray_cluster"} <= set(groups["hydra/launcher"])
    # each choice has its one-line description, from the policy's docstring or the YAML
    assert groups["scheduler"]["static"].startswith("Static batching")
    assert groups["preemption"]["recompute"].endswith("Options: victim=newest mode=recompute.")
    assert groups["model"]["tiny"].startswith("A tiny randomly initialised Llama")
    assert all(desc for choices in groups.values() for desc in choices.values())


def choice_groups(help_text: str) -> dict[str, dict[str, str]]:
    """{group: {choice: description}} read back from `--help`'s "Choices" block."""
    groups: dict[str, dict[str, str]] = {}
    block = help_text.split("Choices (GROUP=CHOICE):\n", 1)[1].split("\n\n", 1)[0]
    current: dict[str, str] = {}
    last = ""
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("    "):
            current = groups.setdefault(line.split()[0].rstrip(","), {})
        elif line.startswith("    ") and line[4] != " ":
            last, _, desc = line.strip().partition("  ")
            current[last] = desc.strip()
        else:
            current[last] += " " + line.strip()
    return groups
