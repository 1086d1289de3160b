"""`python -m experiments.reproduce`: the quick Mooncake reproduction writes its four outputs,
its cells follow the deviation rule, its capacity curve rises to the unbounded cache's hit
rate (which equals the traces' own replay under the engine's counting, token for token);
`--list` names every reproduction; a mistake is one line and exit status 2."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from framework.studies.reproductions import command
from framework.studies.reproductions.cells import Cell
from framework.studies.reproductions.mooncake_cache import TRACES
from framework.studies.reproductions.registry import REPRODUCTIONS
from tests.helpers import assert_refused

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for the module's reproductions: a new SQLite store runs MLflow's
    schema migrations, seconds of CPU, as much as a quick reproduction's own runs. Each
    reproduction logs a run of its own, found by its name."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory, store: str) -> tuple[Path, dict[str, Any], str]:
    """The quick form run once: its folder, its reproduction.json, its MLflow store."""
    if not all(p.is_file() for p in TRACES.values()):
        pytest.skip("the Mooncake traces are not beside the repository (../shared)")
    out = tmp_path_factory.mktemp("mooncake")
    argv = ["mooncake_cache", "--quick", "--workers", "1", "--out", str(out)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"]) == out
    return out, json.loads((out / "reproduction.json").read_text()), store


def test_quick_mooncake_writes_the_four_outputs(quick: tuple[Path, dict, str]) -> None:
    out, data, store = quick
    assert (out / "reproduction.png").read_bytes()[:8] == PNG
    md = (out / "reproduction.md").read_text()
    assert md.startswith("# mooncake_cache: Mooncake (FAST 2025")
    for heading in ("## Set-up", "## Assumptions", "## Runs", "## Requests that arrive together"):
        assert heading in md
    assert data["name"] == "mooncake_cache" and data["quick"] is True
    assert data["paper"] == REPRODUCTIONS["mooncake_cache"].paper
    assert data["overrides"] == [f"mlflow.tracking_uri={store}"]
    assert all(set(a) == {"text", "source"} and a["source"] for a in data["assumptions"])
    client = MlflowClient(store)
    (run,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string="tags.`reproduction.name` = 'mooncake_cache'",
    )
    assert run.info.status == "FINISHED"
    assert run.data.tags["nanoserve.kind"] == "reproduction"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts >= {"reproduction.md", "reproduction.json", "reproduction.png"}
    logged = {k: v for k, v in run.data.metrics.items() if k.endswith(".simulated")}
    assert sorted(logged.values()) == sorted(c["simulated"] for c in data["cells"])


def test_cells_follow_the_deviation_rule(quick: tuple[Path, dict, str]) -> None:
    _, data, _ = quick
    cells = data["cells"]
    table2 = {c["name"].split(":")[0]: c for c in cells if "unbounded cache" in c["name"]}
    assert {t: c["published"] for t, c in table2.items()} == {"conversation": 40, "synthetic": 66}
    for c in cells:
        assert {"name", "published", "simulated", "unit", "deviation"} <= set(c)
        assert c["unit"] == "%" and c["deviation_kind"] == "points"
        lo, hi = c["published"], c["published_high"] or c["published"]
        nearest = min(max(c["simulated"], lo), hi)
        assert c["deviation"] == pytest.approx(c["simulated"] - nearest)
    for trace, s in data["data"]["series"].items():
        assert table2[trace]["simulated"] == pytest.approx(s["unbounded"]["hit_rate"])


def test_the_curve_rises_to_the_unbounded_hit_rate(quick: tuple[Path, dict, str]) -> None:
    _, data, _ = quick
    for trace, s in data["data"]["series"].items():
        curve = s["curve"]
        caps = [p["capacity_tokens"] for p in curve]
        assert caps == sorted(caps) and caps[0] == 10_000, trace
        rates = [p["hit_rate"] for p in curve]
        assert all(a <= b for a, b in itertools.pairwise(rates)), (trace, rates)
        assert rates[0] < rates[-1], trace  # the smallest cache evicts what the largest keeps
        unbounded = s["unbounded"]
        assert unbounded["evictions"] == 0 and unbounded["rejected"] == 0
        assert curve[-1]["pool_blocks"] >= unbounded["pool_blocks"]
        assert rates[-1] == unbounded["hit_rate"], trace
        # The engine finds exactly what the hash ids allow under its own counting.
        assert unbounded["hit_tokens"] == s["replay"]["engine_rule_tokens"], trace
        assert s["replay"]["engine_rule"] <= s["replay"]["published_rule"]
        # Requests that arrive together can only lose hits, never gain them.
        assert all(c["hit_tokens"] <= unbounded["hit_tokens"] for c in s["concurrent"])


def test_list_names_every_reproduction(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(REPRODUCTIONS)
    for line, e in zip(lines, REPRODUCTIONS.values(), strict=True):
        assert line.startswith(e.name) and e.paper in line and e.figure in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["nope"], f"unknown reproduction 'nope'; choose from {', '.join(sorted(REPRODUCTIONS))}"),
        ([], "name a reproduction"),
        (["mooncake_cache", "--workers", "0"], "--workers must be >= 1; got 0"),
        (["mooncake_cache", "--quick", "engine.nope=1"], "engine.nope"),
        (["mooncake_cache", "--quick", "engine.max_num_seqs=0"], "engine.max_num_seqs"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    capsys.readouterr()
    status = command.main(argv)
    assert_refused(status, capsys.readouterr().err, expected)


def test_deviation_rules() -> None:
    assert Cell("a", 40, 37, "%").deviation == pytest.approx(-3)  # points
    assert Cell("b", 2.0, 2.6, "x").deviation == pytest.approx(0.3)  # ratio - 1
    ranged = Cell("c", 41, None, "%", published_high=75)
    assert ranged.deviation is None and ranged.published_text() == "41-75%"
    assert Cell("c", 41, 60, "%", published_high=75).deviation == 0  # inside the range
    assert Cell("c", 41, 30, "%", published_high=75).deviation == pytest.approx(-11)
    assert Cell("c", 41, 82, "%", published_high=75).relative == pytest.approx(82 / 75 - 1)


def test_quick_sglang_offline_sets_both_engines_beside_their_published_runs(
    tmp_path: Path, store: str
) -> None:
    """The grid-and-compare reproduction on the contract: two set-ups by two engines, each run
    under its engine's profile and the defaults its rules give, a ratio cell that is the two
    runs' ratio, and a figure drawn from the cells alone."""
    from framework.studies.reproductions import sglang_offline as sg

    argv = ["sglang_offline", "--quick", "--workers", "1", "--out", str(tmp_path)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"]) == tmp_path
    data = json.loads((tmp_path / "reproduction.json").read_text())
    cells = data["cells"]
    assert [c["unit"] for c in cells] == ["tok/s", "tok/s", "x"] * 2
    assert [c["published"] for c in cells[:2]] == [p[1] for p in sg.PUBLISHED["8b"].values()]
    for a, b, ratio in (cells[:3], cells[3:]):
        assert ratio["simulated"] == pytest.approx(a["simulated"] / b["simulated"])
        assert ratio["deviation"] == pytest.approx(ratio["simulated"] / ratio["published"] - 1)
    runs = {j["name"]: j for j in data["jobs"]}
    assert len(runs) == 4 and all(
        j["metrics"]["requests_finished"] == sg.QUICK for j in runs.values()
    )
    assert "executor.software=sglang-0.3" in runs["70b SGLang 0.3.0"]["overrides"]
    assert "scheduler.decode_steps=10" in runs["8b vLLM 0.6.0"]["overrides"]
    assert (tmp_path / "reproduction.png").read_bytes().startswith(PNG)


def test_quick_vllm_preemption_prices_swaps_by_block_size_and_runs_both_modes(
    tmp_path: Path, store: str
) -> None:
    """Fig. 19: the microbenchmark's swap falls with the block size while the recompute stays
    flat, the crossover is where the curves cross, and end to end each block size runs once
    by swap and once by recompute, the swaps computing nothing twice."""
    from framework.studies.reproductions import vllm_preemption as vp

    argv = ["vllm_preemption", "--quick", "--workers", "1", "--out", str(tmp_path)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"])
    data = json.loads((tmp_path / "reproduction.json").read_text())
    micro = {int(k): v for k, v in data["data"]["microbenchmark_ms"].items()}
    swaps = [micro[bs]["swap in + out"] for bs in vp.SIZES]
    assert swaps == sorted(swaps, reverse=True)  # fewer, larger copies as blocks grow
    assert len({round(m["recompute"], 9) for m in micro.values()}) == 1  # no blocks in it
    cells = {c["name"]: c for c in data["cells"]}
    curve = {bs: (m["swap in + out"], m["recompute"]) for bs, m in micro.items()}
    cross = vp.crossover(curve)
    assert cells["(a) crossover block size"]["simulated"] == cross
    assert cross is not None and curve[cross][0] <= curve[cross][1]
    smaller = [bs for bs in vp.SIZES if bs < cross]
    assert all(curve[bs][0] > curve[bs][1] for bs in smaller[-1:])
    runs = {j["name"]: j["metrics"] for j in data["jobs"]}
    for bs in vp.QUICK.sizes:
        swap, recompute = runs[f"swap {bs}"], runs[f"recompute {bs}"]
        assert swap["swapped_out_blocks"] == swap["swapped_in_blocks"] > 0
        assert swap["recomputed_tokens"] == 0 and recompute["swapped_out_blocks"] == 0
        assert recompute["preemptions"] > 0 and recompute["recomputed_tokens"] > 0
    assert (tmp_path / "reproduction.png").read_bytes().startswith(PNG)


def test_quick_vllm_sharing_forks_samples_and_searches_beams(tmp_path: Path, store: str) -> None:
    """Figs. 14-15: every run forks its samples and saves memory, more with more samples;
    vLLM and Orca (Oracle) are searched at each n; beam search runs on the model, its beams
    sharing more than parallel samples do."""
    from framework.studies.reproductions import vllm_sharing as vs

    argv = ["vllm_sharing", "--quick", "--workers", "1", "--out", str(tmp_path)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"])
    data = json.loads((tmp_path / "reproduction.json").read_text())
    runs = {j["name"]: j["metrics"] for j in data["jobs"]}
    saving = [runs[f"alpaca n={n}"]["kv_sharing_saving"] for n in vs.SAMPLES]
    assert 0 < saving[0] < saving[-1] < 1
    for name, m in runs.items():
        if not name.startswith("capacity Orca"):
            assert m["forks"] > 0 and m["forked_blocks"] > 0, name
        else:  # extents share nothing
            assert m["forks"] == 0 and m["kv_sharing_saving"] == 0, name
    cells = {c["name"]: c for c in data["cells"]}
    beams = cells["Alpaca, beam search, width 6: memory saving"]["simulated"]
    assert beams > cells["Alpaca, parallel sampling, n=6: memory saving"]["simulated"]
    assert all(runs[f"alpaca beam width {w}"]["beam_rounds"] > 0 for w in vs.SAMPLES)
    assert set(data["data"]["capacity"]) == {"vLLM", "Orca (Oracle)"}
    assert (tmp_path / "reproduction.png").read_bytes().startswith(PNG)
