"""The disaggregation study (`+experiment=disaggregation`): a sweep whose every job is searched
for its goodput under its workload's SLO, and the table's columns read from the run at it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import NamedTuple

import pytest

from framework.run.errors import UserError
from framework.studies.goodput_study import gives_way, pool_utilisation, settings
from tests.helpers import cli


class Done(NamedTuple):
    """What `python run.py` left: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def study(tmp_path: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[Done, Path]:
    """`python run.py -m +experiment=disaggregation OVERRIDES` into a sweep folder of its own
    (no observers, MLflow in the test's folder); how it ended and the folder. The command
    line runs in this process (`cli`), as `run.py` would run it: a subprocess would import
    torch again, most of the refusal test's cost. The searches run one at a time here
    (`workers=1`) so that nothing is forked from a test worker; which process runs a search
    changes none of its numbers."""
    sweep = tmp_path / "sweep"
    args = (
        "-m", "+experiment=disaggregation", *overrides, "hydra.callbacks.study.workers=1",
        "observers=[]", f"hydra.sweep.dir={sweep}", f"mlflow.tracking_uri={tmp_path / 'ml'}",
    )  # fmt: skip
    try:
        return Done(*cli(capsys, *args)), sweep
    except SystemExit as exc:
        # A study's refusal leaves Hydra as SystemExit(reason); the interpreter running
        # `python run.py` prints the reason to stderr and exits with status 1.
        seen = capsys.readouterr()
        if exc.code is None or isinstance(exc.code, int):
            return Done(exc.code or 0, seen.out, seen.err), sweep
        return Done(1, seen.out, f"{seen.err}{exc.code}\n"), sweep


def test_the_study_searches_each_layout_for_its_goodput(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two layouts of the 4 GPUs on 200 chat-like requests: a table row each, with its
    goodput, the pools it has and, disaggregated, its transfers."""
    done, sweep = study(
        tmp_path, capsys, "workload=azure_conv_poisson", "workload.limit=200",
        "layout=colocated,p1d3_ethernet", "hydra.callbacks.study.max_probes=5", "workload.rate=32",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "study disaggregation:" in done.stdout
    with (sweep / "disaggregation.csv").open() as f:
        rows = {r["layout"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"colocated", "p1d3_ethernet"}
    for row in rows.values():
        assert row["workload"] == "azure_conv_poisson" and row["gpus"] == "4"
        assert float(row["goodput_rps"]) >= 32 * 2 ** (-4)  # the search's lowest probe met
        assert float(row["goodput_per_gpu_rps"]) == pytest.approx(float(row["goodput_rps"]) / 4)
        assert 1 <= int(row["probes"]) <= 5
    colocated, split = rows["colocated"], rows["p1d3_ethernet"]
    assert 0 < float(colocated["mixed_util"]) <= 1
    assert colocated["prefill_util"] == colocated["kv_transfer_s_p99"] == ""
    assert 0 < float(split["prefill_util"]) <= 1 and 0 < float(split["decode_util"]) <= 1
    assert split["mixed_util"] == "" and float(split["kv_transfer_s_p99"]) > 0
    md = (sweep / "disaggregation.md").read_text()
    assert md.count("| azure_conv_poisson |") == 2 and "goodput_rps: the highest" in md
    # Every probe of both searches, with its run's figures and its verdict.
    with (sweep / "disaggregation.probes.csv").open() as f:
        probes = list(csv.DictReader(f))
    for layout, row in rows.items():
        mine = [p for p in probes if p["layout"] == layout]
        assert len(mine) == int(row["probes"]) and {p["job"] for p in mine} == {mine[0]["job"]}
        assert [int(p["probe"]) for p in mine] == list(range(1, len(mine) + 1))
        met = [float(p["rate_rps"]) for p in mine if p["met"] == "True"]
        assert float(row["goodput_rps"]) == max(met)
        for p in mine:
            assert (p["met"] == "True") == (float(p["attainment"]) >= 0.9)
            assert float(p["tbt_p99_s"]) > 0 and float(p["scheduling_delay_p50_s"]) >= 0
    assert all(p["kv_transfer_s_p99"] for p in probes if p["layout"] == "p1d3_ethernet")
    head = (sweep / "disaggregation.png").read_bytes()[:24]
    size = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and size == (4 * 320, 360)  # 4 panels, 3.2 x 3.6 in


def test_a_workload_without_an_slo_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done, sweep = study(
        tmp_path, capsys, "workload=arxiv_poisson", "workload.limit=20", "layout=colocated",
        "~hydra.callbacks.study.slo.arxiv_poisson",
    )  # fmt: skip
    assert done.returncode != 0
    assert "no SLO for workload=arxiv_poisson" in done.stderr
    assert "hydra.callbacks.study.slo.arxiv_poisson=[TTFT_S,TPOT_S]" in done.stderr
    assert (sweep / "disaggregation.refused.txt").is_file()


def test_which_target_gives_way_first() -> None:
    assert gives_way(None, 0.9) == "-"
    assert gives_way({"ttft_met": 0.5, "tpot_met": 1.0}, 0.9) == "ttft"
    assert gives_way({"ttft_met": 0.95, "tpot_met": 0.2}, 0.9) == "tpot"
    assert gives_way({"ttft_met": 0.1, "tpot_met": 0.2}, 0.9) == "both"
    # Each met alone, not both together on the same requests.
    assert gives_way({"ttft_met": 0.92, "tpot_met": 0.93}, 0.9) == "both together"


def test_a_pools_utilisation_is_its_replicas_mean() -> None:
    summary = {
        "replicas": [
            {"role": "prefill", "utilisation": 0.5},
            {"role": "decode", "utilisation": 0.2},
            {"role": "decode", "utilisation": 0.4},
        ]
    }
    got = pool_utilisation(summary)
    assert got["prefill_util"] == 0.5 and got["decode_util"] == pytest.approx(0.3)
    assert got["mixed_util"] is None
    assert pool_utilisation({"replicas": [{"utilisation": 0.7}]})["mixed_util"] == 0.7


def test_an_slo_must_be_two_positive_seconds() -> None:
    with pytest.raises(UserError, match=r"slo\.chat: ttft_s and tpot_s must be > 0"):
        settings({"slo": {"chat": [0.25, 0]}})
    assert settings({"slo": {"chat": [0.25, 0.05]}, "workers": 1}).slo == {"chat": (0.25, 0.05)}
