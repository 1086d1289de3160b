"""The tools run end to end on the tiny model, and what they write holds together: the same
work in every row they compare, counts that add up, ratios that follow from their rows, and
pictures of the size their panels make. (Their timings are measured by running them, never
asserted here.)"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import pytest

from experiments.bench import ab, same_behaviour, same_speed
from experiments.policy import window_sweep
from framework.core.request import RequestSpec, SamplingParams

# The relative error of a ratio of two times the CSV keeps to 6 significant digits (each off
# by at most half a unit of its 6th digit, 5e-6 of it): twice that, with room to spare.
CSV_ROUNDING = 2e-5


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's (width, height), from its header; anything else is no PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


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
        "waste_fraction",
        "host_s_per_step",
        "forward_s_per_step",
        "schedule_s_per_step",
        "output_s_per_step",
        "step_s",
        "outputs_equal",
    ):
        assert col in rows[0], col
    for n in ("4", "6"):  # the same work at every window: the same tokens, none wasted
        same = [r for r in rows if r["max_tokens"] == n]
        assert {(r["requests"], r["tokens_kept"], r["steps"]) for r in same} == {
            ("3", str(3 * int(n)), n)
        }
        for r in same:
            assert int(r["token_slots"]) == int(r["tokens_kept"])
            assert float(r["waste_fraction"]) == 0 and r["outputs_equal"] == "True"
            assert float(r["transfers_per_step"]) == int(r["transfers"]) / int(r["steps"])
    # A deferred window of k steps reads the tokens back once every k steps (0: every step),
    # and window 0 never computes past a stop.
    for r in (r for r in rows if r["policy"] == "deferred"):
        k, steps = int(r["window"]), int(r["steps"])
        assert int(r["transfers"]) == -(-steps // max(k, 1)), r
    assert all(r["overshoot_tokens"] == "0" for r in rows if r["window"] == "0")
    assert png_size(out / "window_sweep.png") == (1980, 440)  # four panels, 18 x 4 in
    md = (out / "window_sweep.md").read_text().splitlines()
    assert md[0].startswith("| max_tokens | window |") and len(md) == 2 + len(rows)


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
    # Both settings did the same work: the same steps, the same tokens (tokens/s x wall).
    assert len({r["steps"] for r in rows}) == 1
    tokens = [float(r["tokens_per_s"]) * float(r["wall_s"]) for r in rows]
    assert max(tokens) == pytest.approx(min(tokens), rel=1e-4)
    # The headline is the median of the rounds' ratios of wall times, with their range. The
    # report rounds ratios of the unrounded times to 3 decimals, while the CSV keeps each time
    # to 6 significant digits, so a ratio recomputed here may sit across a rounding boundary
    # from the reported one: each reported figure must be within half its last digit of the
    # recomputed ratio, plus what the CSV's rounding can move that ratio by.
    wall = {(r["round"], r["setting"]): float(r["wall_s"]) for r in rows}
    ratios = [wall[n, "B"] / wall[n, "A"] for n in ("1", "2")]
    text = (out / "ab.md").read_text()
    found = re.search(r"B/A wall time: \*\*([\d.]+)\*\* \(.*range ([\d.]+)-([\d.]+)\)", text)
    assert found, text
    median, low, high = map(float, found.groups())
    for reported, recomputed in (
        (median, statistics.median(ratios)),
        (low, min(ratios)),
        (high, max(ratios)),
    ):
        assert abs(reported - recomputed) <= 5e-4 + CSV_ROUNDING * recomputed, (reported, ratios)
    assert "| round | A wall s | B wall s | B/A |" in text


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
    assert len({r["kernels"] for r in rows}) == 1  # the first run's choices, pinned for B
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
    # a count the base does not report (added since) is no difference
    newer = {"counts": {**run["counts"], "forks": None}, "tokens": run["tokens"]}
    assert same(newer, {"counts": {**run["counts"], "forks": 0}, "tokens": run["tokens"]}) is None


def test_same_speed_alternates_processes_over_the_same_counts(tmp_path: Path) -> None:
    """Each round runs the base and this tree in turn, the order alternating, and a case's
    ratio comes from one round's pair; both trees count alike (HEAD: the same code)."""
    if not (same_speed.TRACES / "azure_llm_2023_conv.csv").is_file():
        pytest.skip("the Azure traces live in ../shared, absent here")
    found = same_speed.main(
        ["--base", "HEAD", "--cases", "sim_conv", "--rounds", "2", "--out", str(tmp_path),
         "model=tiny", "workload.limit=20"]
    )  # fmt: skip
    (s,) = found
    assert s["case"] == "sim_conv" and s["rate"] == "steps_per_s" and s["same_counts"]
    assert 0 < s["low"] <= s["median"] <= s["high"]
    with (tmp_path / "same_speed.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["round"], r["side"]) for r in rows] == [
        ("0", "base"), ("0", "here"), ("1", "here"), ("1", "base")
    ]  # fmt: skip
    assert {r["steps"] for r in rows} == {rows[0]["steps"]} != {"0"}
    assert "| sim_conv | steps_per_s |" in (tmp_path / "same_speed.md").read_text()


def test_every_command_is_in_the_table_and_runs_its_tools_main() -> None:
    """Each `python -m experiments.<tool>` the README documents is a name in `TOOLS`, whose
    module has a `main`; importing a command runs nothing; and a command runs under `-m`,
    its exit status the tool's."""
    import importlib
    import re
    import subprocess
    import sys

    import experiments

    readme = (Path(experiments.__file__).parent / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"python -m experiments\.([a-z_]+)", readme))
    assert documented and documented <= set(experiments.TOOLS), documented - set(experiments.TOOLS)
    for name, target in experiments.TOOLS.items():
        assert callable(getattr(importlib.import_module(target), "main", None)), name
    quiet = importlib.import_module("experiments.reproduce")  # imported, not run
    assert quiet.__name__ == "experiments.reproduce"
    root = Path(experiments.__file__).resolve().parents[1]
    listed = subprocess.run(
        [sys.executable, "-m", "experiments.reproduce", "--list"],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "vllm_batching" in listed.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "experiments.no_such_tool"],
        cwd=root, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode != 0 and "No module named" in missing.stderr
