"""`python -m experiments.serve_bench --quick`: a real load generator (guidellm) against
serve.py on 127.0.0.1, bounded in requests and seconds, its figures joined with the
server's own request by request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("guidellm")  # the `bench` extra
pytest.importorskip("fastapi")


def test_guidellm_against_the_server_beside_its_own_figures(tmp_path: Path) -> None:
    from experiments.bench.serve_bench import main

    main(
        [
            "--quick", "--concurrency", "1,4", "--requests", "4", "--seconds", "60",
            "--prompt-tokens", "24", "--output-tokens", "6", "--out", str(tmp_path),
            "engine.packed_linears=false", "engine.paged_kernel=false",
            "engine.argmax_kernel=false", "engine.layer_glue=false",
        ]
    )  # fmt: skip
    rows = json.loads((tmp_path / "serve_bench.json").read_text())
    for row in rows:  # every request guidellm completed is joined with the server's own
        bench = json.loads((tmp_path / f"guidellm-c{row['concurrency']}.json").read_text())
        done = [r for b in bench["benchmarks"] for r in b["requests"]["successful"]]
        assert row["requests"] == len(done), (
            row,
            {k: len(v) for k, v in bench["benchmarks"][0]["requests"].items()},
        )
    assert [(r["concurrency"], r["requests"]) for r in rows] == [(1, 4), (4, 4)]
    for row in rows:
        # The client's clock starts before the server's and stops after it: never less.
        assert row["ttft_diff_p50"] >= 0
        assert row["client_ttft_p50"] >= row["server_ttft_p50"] > 0
        assert row["server_itl_mean"] > 0
    table = (tmp_path / "serve_bench.md").read_text()
    assert "| 1 | 4 |" in table and "| 4 | 4 |" in table
    metrics = json.loads((tmp_path / "server" / "metrics.json").read_text())
    assert metrics["requests_finished"] == 8 and metrics["incomplete"] is False
