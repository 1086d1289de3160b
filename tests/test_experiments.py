"""The studies run end to end on the tiny model and write every column they promise.
(Their numbers are measured by running them, never asserted here.)"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.bench import ab, same_behaviour
from experiments.policy import window_sweep
from framework.engine.request import RequestSpec, SamplingParams


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


def test_ab_alternates_rounds_and_reports_the_ratio(tmp_path: Path) -> None:
    out = ab.main(
        [
            "--quick",
            "--rounds",
            "2",
            "--b",
            "engine.block_size=32",
            "--out",
            str(tmp_path),
            "workload.limit=4",
            "workload.max_tokens=8",
        ]
    )
    with (out / "ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    # A first in odd rounds, B first in even ones: neither always runs on a warmer machine
    assert [(r["round"], r["setting"]) for r in rows] == [
        ("1", "A"),
        ("1", "B"),
        ("2", "B"),
        ("2", "A"),
    ]
    for col in ab.COLUMNS:
        assert rows[0][col] != "", col
    text = (out / "ab.md").read_text()
    assert "B/A wall time: **" in text and "| round | A wall s | B wall s | B/A |" in text


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ([], ["model=smollm2"], "differ in 'model'"),
        ([], ["workload=straggler"], "differ in 'workload'"),
        (["engine.block_size=16"], [], "compose to the same config"),
    ],
)
def test_ab_refuses_to_compare_different_work(a: list[str], b: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ab.compare(["model=tiny"], a, b, rounds=1)


def test_ab_observers_preset_runs_whole_processes_in_alternating_rounds(tmp_path: Path) -> None:
    """`--observers`: `python run.py` with the default observers against `[console]`, each
    B run in a new store under `--fresh-store`; the ratios and each run's start-up reported."""
    out = ab.main(
        ["--observers", "--fresh-store", "--quick", "--rounds", "1", "--requests", "3",
         "--out", str(tmp_path)]
    )  # fmt: skip
    with (out / "observers_ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["round"], r["setting"]) for r in rows] == [("1", "A"), ("1", "B")]
    for row in rows:
        assert float(row["makespan_s"]) > 0 and float(row["startup_observers_s"]) >= 0
    # B's runs each made a store of their own; A's logged nowhere
    assert (tmp_path / "stores" / "r1-B" / "mlflow.db").is_file()
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store").exists()
    text = (out / "observers_ab.md").read_text()
    assert "| makespan_s | " in text and "| ttft_p50_s | " in text and "CPU: " in text
    assert "a fresh store every run" in text


def test_ab_observers_preset_takes_no_a_or_b(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        ab.parse(["--observers", "--b", "engine.block_size=32"])
    assert raised.value.code == 2 and "takes no --a or --b" in capsys.readouterr().err


def test_ab_output_check_names_the_first_difference() -> None:
    greedy = RequestSpec(id="g", prompt_token_ids=[1, 2, 3])
    sampled = RequestSpec(
        id="s", prompt_token_ids=[1, 2], sampling=SamplingParams(temperature=0.8, seed=3)
    )
    same = {"g": [5, 6], "s": [7, 8]}
    assert ab.first_difference(None, [greedy, sampled], same, dict(same)) is None
    got = ab.first_difference(None, [greedy, sampled], same, {"g": [5, 6], "s": [7, 9]})
    assert got is not None and got.startswith("s: sampled tokens differ")
    assert ab.first_difference(None, [greedy], same, {}) == "g: no output from B"


def test_same_behaviour_finds_none_against_this_commit(tmp_path: Path) -> None:
    """The working tree against HEAD (a fresh clone's: the same code) on one case."""
    found = same_behaviour.main(
        ["--base", "HEAD", "--cases", "disaggregated", "--out", str(tmp_path)]
    )
    assert found == {"disaggregated": None}
    assert "| disaggregated | identical |" in (tmp_path / "same_behaviour.md").read_text()


def test_same_behaviour_names_the_first_difference() -> None:
    run = {"counts": {"steps": 9, "preemptions": 2}, "tokens": {"r0": [1, 2], "r1": [3]}}
    same = same_behaviour.first_difference
    assert same(run, {"counts": dict(run["counts"]), "tokens": dict(run["tokens"])}) is None
    fewer = {"counts": {"steps": 9, "preemptions": 1}, "tokens": run["tokens"]}
    assert same(run, fewer) == "preemptions: 2 at the base, 1 here"
    other = {"counts": run["counts"], "tokens": {"r0": [1, 2], "r1": [4]}}
    assert same(run, other) == "r1's tokens differ"
    assert same(run, {"failed": "exit 2: boom"}) == "this tree's run failed: exit 2: boom"
