"""The soak runs end to end on a short workload and reports what it promises: the invariants
held, every request served, and a table of steps by queue length whose rows add up to the
run and sit in their bins. Its seconds are measured by running it, never asserted here."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.policy import soak


def test_short_soak_holds_every_invariant_and_reports(tmp_path: Path) -> None:
    out = soak.main(
        [
            "--requests",
            "200",
            "--num-blocks",
            "16",
            "--buckets",
            "4",
            "--out",
            str(tmp_path),
            # Everyone at t=0: the counts below then do not depend on this machine's speed.
            "workload.arrival=burst",
            "workload.prompt_len_max=16",
            "workload.output_len_max=8",
        ]
    )
    with (out / "soak.csv").open() as f:
        table = list(csv.DictReader(f))
    assert table and set(table[0]) >= {
        "waiting_from",
        "waiting_to",
        "steps",
        "mean_waiting",
        "schedule_s",
        "allocate_s",
        "step_s",
    }
    report = (out / "soak.md").read_text()
    summary = dict(
        (cells[1].strip(), cells[2].strip())
        for cells in (line.split("|") for line in report.splitlines())
        if len(cells) == 4 and cells[1].strip() not in ("metric", "---")
    )
    for field in (
        "rss_start_mb",
        "rss_end_mb",
        "peak_rss_start_mb",
        "peak_rss_end_mb",
        "schedule_s_shortest_queue",
        "schedule_s_longest_queue",
        "schedule_ratio_longest_to_shortest",
        "schedule_s_per_1000_waiting",
        "max_preemptions_per_request",
    ):
        assert field in summary, field
    assert summary["invariants_held"] == "True"
    assert summary["requests_finished"] == "200" and summary["requests_rejected"] == "0"
    assert int(summary["max_waiting"]) > 150, "200 arrive at once: the queue starts long"
    assert int(summary["preemptions"]) > 0, "the tight pool must make the soak preempt"
    assert int(summary["peak_blocks"]) <= int(summary["num_blocks"]) == 16
    # Every step is in one bin of waiting-queue length; the bins are in order, each step's
    # queue within its bin's bounds, and the last bin ends at the longest queue.
    assert sum(int(r["steps"]) for r in table) == int(summary["steps"])
    bounds = [(int(r["waiting_from"]), int(r["waiting_to"])) for r in table]
    assert bounds == sorted(bounds) and bounds[-1][1] == int(summary["max_waiting"])
    for r, (low, high) in zip(table, bounds, strict=True):
        assert low <= float(r["mean_waiting"]) <= high
        assert 0 < float(r["mean_rows"]) <= 16  # engine.max_num_seqs
    ratio = float(summary["schedule_s_longest_queue"]) / float(summary["schedule_s_shortest_queue"])
    assert float(summary["schedule_ratio_longest_to_shortest"]) == pytest.approx(ratio, rel=2e-3)
