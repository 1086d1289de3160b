"""`python -m experiments.serve_bench --quick`: real load generators (guidellm, aiperf,
inference-perf) against serve.py on 127.0.0.1, bounded in requests and seconds, their
figures joined with the server's own request by request; and the reading of each tool's
files, on small stored samples of their real output (tests/fixtures/loadgen_outputs/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench.loadgens import aiperf, executable, guidellm, inference_perf

SAMPLES = Path(__file__).parent / "fixtures" / "loadgen_outputs"
# The tiny model without the C++ kernels: nothing to build on a fresh checkout. Its engine
# in the server's own process: what is checked here is the tool's figures joined with the
# server's, whichever process steps the engine (the engine's process is
# tests/test_server_process.py's and tests/test_server_cli.py's), and a second process
# would import torch once more.
SMALL = [
    "--quick", "--requests", "4", "--seconds", "60", "--prompt-tokens", "24",
    "--output-tokens", "6", "engine.packed_linears=false", "engine.paged_kernel=false",
    "engine.argmax_kernel=false", "engine.layer_glue=false", "server.engine=thread",
]  # fmt: skip


@pytest.mark.parametrize(
    ("parse", "sample", "prefix"),
    [
        (guidellm.parse, "guidellm-c2.json", "chatcmpl-"),
        (aiperf.parse, "aiperf-c4", "chatcmpl-"),
        (inference_perf.parse, "inference-perf-c4", "cmpl-"),
    ],
)
def test_each_tools_files_read_into_one_shape(parse, sample: str, prefix: str) -> None:
    run = parse(SAMPLES / sample)
    assert run.failed == 0 and run.completed >= 2
    assert run.output_tok_s is not None and run.output_tok_s > 0
    assert len(run.requests) == 2  # the samples keep two requests' records
    for rid, r in run.requests.items():
        assert rid.startswith(prefix)  # the server's response id, to join requests.csv on
        assert r["ttft"] is not None and 0 < r["ttft"] < 5  # seconds, not milliseconds
        assert r["itl"] is not None and 0 < r["itl"] < 1
        assert r["tokens"] == 6  # the server's count (usage), as the stored runs asked


def test_a_row_joins_the_tool_with_the_server_and_counts_its_failures() -> None:
    from experiments.bench.loadgens import ClientRun
    from experiments.bench.serve_bench import compare

    run = ClientRun(
        requests={
            "a": {"ttft": 0.12, "itl": 0.021, "tokens": 4},
            "b": {"ttft": 0.15, "itl": None, "tokens": 4},
            "elsewhere": {"ttft": 0.1, "itl": 0.02, "tokens": 4},
        },
        completed=3,
        failed=1,
        output_tok_s=7.5,
    )
    server = {
        "a": {"ttft": 0.1, "itl": 0.02, "tokens": 4, "arrival": 1.0, "finished": 1.5},
        "b": {"ttft": 0.1, "itl": 0.02, "tokens": 4, "arrival": 1.2, "finished": 2.0},
    }
    row = compare("aiperf", 2, run, server)
    assert (row["tool"], row["completed"], row["failed"], row["requests"]) == ("aiperf", 3, 1, 2)
    assert row["server_output_tok_s"] == pytest.approx(8 / 1.0)
    assert row["ttft_diff_p50"] == pytest.approx(0.035)
    assert row["itl_diff_mean"] == pytest.approx(0.001)


def check_rows(out: Path, tool: str, levels: list[int]) -> list[dict]:
    """Every request the tool completed is found in the server's requests.csv, none failed,
    and both throughputs are reported."""
    rows = json.loads((out / "serve_bench.json").read_text())
    assert [(r["tool"], r["concurrency"]) for r in rows] == [(tool, c) for c in levels]
    for row in rows:
        assert row["failed"] == 0 and row["completed"] == row["requests"] == 4, row
        assert row["client_output_tok_s"] > 0 and row["server_output_tok_s"] > 0
        # The client's clock starts before the server's and stops after it: never less.
        assert row["ttft_diff_p50"] >= 0
        assert row["client_ttft_p50"] >= row["server_ttft_p50"] > 0
        assert row["server_itl_mean"] > 0
    metrics = json.loads((out / "server" / "metrics.json").read_text())
    assert metrics["requests_finished"] == 4 * len(levels) and metrics["incomplete"] is False
    return rows


def test_guidellm_against_the_server_beside_its_own_figures(tmp_path: Path) -> None:
    pytest.importorskip("guidellm")  # the `bench` extra
    pytest.importorskip("fastapi")
    from experiments.bench.serve_bench import main

    main([*SMALL, "--concurrency", "1,4", "--out", str(tmp_path)])
    check_rows(tmp_path, "guidellm", [1, 4])
    table = (tmp_path / "serve_bench.md").read_text()
    assert "| guidellm | 1 | 4 | 0 | 4 |" in table and "| guidellm | 4 | 4 | 0 | 4 |" in table


@pytest.mark.parametrize("tool", ["aiperf", "inference-perf"])
def test_tool_in_its_own_venv_against_the_server(tool: str, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    exe = executable(tool, None)
    if exe is None:
        pytest.skip(f"{tool} is not installed (make setup-loadgen)")
    from experiments.bench.serve_bench import main

    main([*SMALL, "--tool", tool, "--concurrency", "2", "--out", str(tmp_path)])
    check_rows(tmp_path, tool, [2])
