"""The studies run end to end on the tiny model and write every column they promise.
(Their numbers are measured by running them, never asserted here.)"""

from __future__ import annotations

import csv
from pathlib import Path

from experiments import window_sweep


def test_window_sweep_writes_csv_table_and_plot(tmp_path: Path) -> None:
    out = window_sweep.main(
        [
            "--windows",
            "0",
            "2",
            "--max-tokens",
            "4",
            "6",
            "--limit",
            "3",
            "--out",
            str(tmp_path),
            "model=tiny",
        ]
    )
    with (out / "window_sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["max_tokens"], r["policy"]) for r in rows] == [
        ("4", "deferred"),
        ("4", "deferred"),
        ("4", "adaptive"),
        ("6", "deferred"),
        ("6", "deferred"),
        ("6", "adaptive"),
    ]
    assert [r["window"] for r in rows if r["policy"] == "deferred"] == ["0", "2", "0", "2"]
    for col in (
        "transfers_per_step",
        "overshoot_tokens",
        "expected_overshoot",
        "abandoned_tokens",
        "waste_fraction",
        "host_s_per_step",
        "forward_s_per_step",
        "schedule_s_per_step",
        "output_s_per_step",
        "step_s",
        "outputs_equal",
    ):
        assert col in rows[0], col
    assert float(rows[1]["transfers_per_step"]) < float(rows[0]["transfers_per_step"])
    assert (out / "window_sweep.png").stat().st_size > 0
    assert "| max_tokens | window |" in (out / "window_sweep.md").read_text()
