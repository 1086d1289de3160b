"""The benchmark runs end to end on the tiny model and writes every column and target it
promises. Its numbers are measured by running it, never asserted here."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest

from experiments.bench import benchmark
from experiments.bench import report as benchmark_report
from experiments.bench.peers import Served
from experiments.bench.probe import Probe
from experiments.bench.rows import TIMES, make_row
from experiments.toolkit.workloads import open_loop
from framework.calibration.grid import fit_lengths
from framework.core.request import RequestSpec, SamplingParams
from framework.run.paths import DEFAULT_TRACE

SYSTEMS = [
    ("nanoserve", "continuous", "incremental", "immediate"),  # the reference, first
    ("nanoserve", "static", "incremental", "immediate"),
    ("hf_static", "", "", ""),
    ("hf_cb", "", "", ""),
]


def run_benchmark(
    out: Path, workloads: tuple[str, ...], dtypes: tuple[str, ...], *more: str
) -> tuple[list[dict[str, str]], str]:
    """The benchmark on the tiny model, its rows and its report."""
    argv = [
        "--workloads",
        ",".join(workloads),
        "--quick",
        "--schedulers",
        "static,continuous",
        "--allocators",
        "incremental",
        "--outputs",
        "immediate",
        "--requests",
        "4",
        "--threads",
        "1",
        "--dtypes",
        ",".join(dtypes),
        "--out",
        str(out),
        *more,
    ]
    out = benchmark.main(argv)
    with (out / "benchmark.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == list(benchmark_report.COLUMNS)
    got = [
        ((r["system"], r["scheduler"], r["allocator"], r["output"]), r["workload"], r["dtype"])
        for r in rows
    ]
    assert sorted(got) == sorted(itertools.product(SYSTEMS, workloads, dtypes))
    for r in rows:
        assert r["outputs_equal"] == "True", r
        assert r["tokens_per_s"] and r["ttft_p50"], r  # reported (values not checked)
        assert r["ratio_vs_hf_static"] and r["ratio_vs_hf_cb"], r
    assert all(r["host_overhead_share"] for r in rows if r["system"] == "nanoserve")
    assert all(bool(r["linear_alone_s"]) == (r["scheduler"] == "continuous") for r in rows)
    return rows, (out / "benchmark.md").read_text()


# The workloads the targets are measured on, in both dtypes, with the machine probe and the
# default job: the whole report. The other two workloads run in a test of their own, in
# fp32 only, so that the two halves run side by side under `make test`'s workers.
TARGET_WORKLOADS = ("azure_closed", "chat48")


def test_benchmark_reports_every_target_on_the_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The Azure slice needs the trace beside the repository (../shared, as in CI); a checkout
    # without it still runs the rest.
    has_trace = DEFAULT_TRACE.is_file()
    workloads = TARGET_WORKLOADS if has_trace else ("chat48",)
    dtypes = ("float32", "bfloat16")
    rows, md = run_benchmark(tmp_path, workloads, dtypes, "--rounds", "2")
    # The reference and the peers (the targets' ratios) report the median of --rounds rounds.
    for r in rows:
        assert ("median of 2 runs" in r["note"]) == (r["scheduler"] != "static"), r
    for name in (*benchmark_report.TARGETS, *benchmark_report.ACROSS):
        assert f"| {name} | " in md, name
    # The machine targets come with what the Linear kernels alone reach (values not checked).
    assert "| the Linear layers alone |" in md and "| the Linear layers alone at batch 1" in md
    sections = [f"## {d}: {part}" for d in dtypes for part in ("machine", "targets", "results")]
    for section in ("## Across dtypes", *sections, *(f"### {w}" for w in workloads)):
        assert section in md
    if has_trace:  # the throughput targets are measured on the queued Azure slice
        assert "not measured" not in md
    # Which CPU, which flags, and which kernels each dtype got (and why) are in the header.
    assert "ISA " in md and "- kernels (float32): linears " in md
    assert "- kernels (bfloat16): linears " in md and "measured" in md
    assert "MLflow: logged run" in capsys.readouterr().out


def test_benchmark_serves_the_straggler_and_the_open_loop(tmp_path: Path) -> None:
    has_trace = DEFAULT_TRACE.is_file()
    workloads = ("straggler", "azure_open") if has_trace else ("straggler",)
    _, md = run_benchmark(
        tmp_path, workloads, ("float32",), "--rounds", "1", "--no-probe", "--no-default-job"
    )
    for section in ("## float32: results", *(f"### {w}" for w in workloads)):
        assert section in md
    if has_trace:  # without the queued slice in the run, its capacity is measured for the rate
        assert "queued-slice capacity" in md


def test_lengths_fit_the_caps() -> None:
    assert fit_lengths([100, 50, 400], 40, "scale") == [10, 5, 40]
    assert fit_lengths([100, 50, 400], 40, "clamp") == [40, 40, 40]
    assert fit_lengths([3, 0], 40, "scale") == [3, 1]


def test_open_loop_keeps_requests_and_spreads_arrivals() -> None:
    specs = [RequestSpec(f"r{i}", [1, 2], SamplingParams(max_tokens=3)) for i in range(20)]
    arrived = open_loop(specs, rate=5.0, seed=0)
    assert [s.id for s in arrived] == [s.id for s in specs]
    times = [s.arrival for s in arrived]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0
    assert arrived == open_loop(specs, rate=5.0, seed=0)


def test_a_system_that_differs_reports_no_times() -> None:
    specs = [RequestSpec("r0", [1, 2], SamplingParams(max_tokens=2))]
    served = Served({"r0": [5, 6]}, {"r0": 0.0}, {"r0": 0.1}, {"r0": 0.2}, wall_s=0.2)
    why = "r0: token 1 differs"
    row = make_row("hf_cb", None, "straggler", specs, (False, 0, why), served)
    assert row["outputs_equal"] is False and why in row["note"]
    assert all(row[c] is None for c in TIMES)


def test_a_goal_past_the_linear_bound_is_called_out_of_reach() -> None:
    # Numbers of a measured run on the 2-core AMD EPYC: batch 1 is past what the Linear
    # kernels allow (2.58x against a goal of 1.5x); the batch-64 goal is not met but lies
    # within the bound (61%).
    machine = Probe(
        threads=2,
        bandwidth_gbs=20.6,
        matmul_gflops=128.0,
        weight_bytes=538_000_000,
        weight_params=134_500_000,
        floor_s=0.026,
        batch1_step_s=0.104,
        ceiling_tps=474.0,
        largest_batch=64,
        largest_batch_tps=196.0,
        linears_b1_s=0.0675,
        linears_big_s=64 / 291,
        host_share_b8=0.0099,
        paged_b8_s=0.136,
        dense_b8_s=0.145,
        stock_b8_s=0.248,
    )
    lines = {line.split(" | ")[0][2:]: line for line in benchmark_report.target_lines([], machine)}
    assert (
        "| not met, out of reach: past the Linear layers alone |"
        in lines["batch-1 decode step vs bandwidth floor"]
    )
    big = lines["largest-batch throughput vs compute ceiling"]
    assert "| not met |" in big and "out of reach" not in big
    assert "| met |" in lines["host overhead at batch 8"]
