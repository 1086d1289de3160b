"""The notebook entry points (`framework.studies.notebook`): a run, a sweep and a capacity
search called from Python return what they did as data, and the data agree with each other,
with the config asked for, and with what `python run.py` does with the same overrides."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from framework.run.errors import UserError
from framework.studies.notebook import goodput, read_run, run, sweep
from tests.helpers import SMALL, cli

pytestmark = pytest.mark.usefixtures("one_thread")

# Eight five-token prompts, seven wanting 4 tokens and one 32, all at t=0, in four slots.
STRAGGLER = ["model=tiny", "workload=straggler", "engine.max_num_seqs=4", "print_outputs=false"]


@pytest.fixture(scope="module")
def static(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Static batching of the straggler preset, its plots drawn as a run draws them."""
    out = tmp_path_factory.mktemp("static")
    return run([*STRAGGLER, "scheduler=static", "observers=[plots]"], out=out)


def test_a_run_returns_its_requests_steps_and_metrics(static) -> None:  # type: ignore[no-untyped-def]
    r, m = static, static.metrics
    assert not m["incomplete"] and r.config.scheduler.name == "static"
    # One row per request, each request once, as many as the workload asked for.
    assert len(r.requests) == m["requests"] == m["requests_finished"] == 8
    assert r.requests["id"].is_unique and set(r.outputs["id"]) == set(r.requests["id"])
    assert sorted(r.requests["output_tokens"]) == [4] * 7 + [32]
    # The three tables count the same tokens as the summary.
    assert r.requests["output_tokens"].sum() == m["tokens_kept"] == r.steps["tokens_kept"].sum()
    lengths = r.outputs.set_index("id")["output_token_ids"].map(len)
    assert (lengths == r.requests.set_index("id")["output_tokens"]).all()
    # One row per step, numbered in order. A static batch keeps its finished rows until its
    # slowest ends (4 steps for four 4-token requests, then 32 for the batch holding the
    # 32-token one): every slot of every step is computed, all but the kept tokens waste.
    assert len(r.steps) == m["steps"] and list(r.steps["step"]) == list(range(m["steps"]))
    assert r.steps["time"].is_monotonic_increasing
    assert m["token_slots"] == m["tokens_kept"] + r.steps["wasted_rows"].sum()
    assert m["steps"] == 4 + 32 and (r.steps["rows"] == 4).all()
    assert m["token_slots"] == 4 * m["steps"]
    assert r.requests["ttft_s"].notna().all() and (r.requests["ttft_s"] > 0).all()


def test_a_run_writes_its_folder_as_run_py_does(static) -> None:  # type: ignore[no-untyped-def]
    names = {p.name for p in static.folder.iterdir()}
    assert {"metrics.json", "requests.csv", "steps.csv", "outputs.jsonl", "config.yaml"} <= names
    assert {"slot_timeline.png", "kv_blocks.png", "latency_cdf.png"} <= names  # observers ran
    assert json.loads((static.folder / "metrics.json").read_text()) == static.metrics
    again = read_run(static.folder)
    pd.testing.assert_frame_equal(again.requests, static.requests)
    pd.testing.assert_frame_equal(again.steps, static.steps)


def test_a_run_is_the_command_lines_run(
    static, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """The same overrides through `python run.py`: the same resolved config, the same counts
    and the same tokens for every request."""
    status, _, err = cli(
        capsys, *STRAGGLER, "scheduler=static", "observers=[plots]", f"hydra.run.dir={tmp_path}"
    )
    assert status == 0, err[-3000:]
    theirs = read_run(tmp_path)
    assert (tmp_path / "config.yaml").read_text() == (static.folder / "config.yaml").read_text()
    for key in ("requests", "steps", "token_slots", "tokens_kept", "preemptions", "transfers"):
        assert theirs.metrics[key] == static.metrics[key], key
    ours = static.outputs.set_index("id")["output_token_ids"]
    assert theirs.outputs.set_index("id")["output_token_ids"].equals(ours)


def test_a_mistake_in_the_overrides_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="scheduler=nope: no such choice"):
        run(["model=tiny", "scheduler=nope"], out=tmp_path)
    with pytest.raises(UserError, match="is a sweep"):
        run(["model=tiny", "+experiment=batching"], out=tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_sweep_returns_one_row_per_point(tmp_path: Path) -> None:
    """Two schedulers x two batch sizes: four rows, in job order, each with the values it
    ran with and the counts its own run folder holds, as the sweep's table has them."""
    overrides = [*STRAGGLER, "observers=[]", "scheduler=static,continuous"]
    points = sweep([*overrides, "engine.max_num_seqs=2,8"], out=tmp_path)
    assert points.attrs["folder"] == tmp_path
    assert list(points["job"]) == ["0", "1", "2", "3"]
    combos = set(zip(points["scheduler"], points["engine.max_num_seqs"], strict=True))
    assert combos == {(s, n) for s in ("static", "continuous") for n in (2, 8)}  # numbers
    assert (points["status"] == "ok").all() and (points["requests_finished"] == 8).all()
    for _, row in points.iterrows():  # each row is its own job's
        job = tmp_path / row["job"]
        ran = OmegaConf.load(job / "config.yaml")
        assert ran.scheduler.name == row["scheduler"]
        assert ran.engine.max_num_seqs == row["engine.max_num_seqs"]
        own = json.loads((job / "metrics.json").read_text())
        for key in ("steps", "token_slots", "mean_rows", "preemptions"):
            assert row[key] == own[key], key
    # The same work each time (the same 60 tokens kept), done differently: continuous
    # batching computes no finished row, and more slots take fewer steps.
    assert (points["tokens_kept"] == 60).all()
    by = points.set_index(["scheduler", "engine.max_num_seqs"])
    assert (by.loc["continuous", "token_slots"] == 60).all()
    assert (by.loc["static", "token_slots"] > 60).all()
    assert by.loc[("static", 8), "steps"] < by.loc[("static", 2), "steps"]
    with (tmp_path / "sweep.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [int(r["token_slots"]) for r in table] == list(points["token_slots"])


def test_a_capacity_search_returns_its_goodput_and_every_probe(tmp_path: Path) -> None:
    """A bracket wide enough to hold a rate that meets the SLO (10 req/s) and one that
    does not (100,000 req/s, a burst), four probes at most."""
    found = goodput(
        SMALL, 0.001, 0.0005, low=10, high=100_000, tolerance=1, max_probes=4, out=tmp_path
    )
    probes = found.probes
    assert 3 <= len(probes) <= 4 and list(probes["probe"]) == list(range(1, len(probes) + 1))
    assert list(probes["rate_rps"][:2]) == [10, 100_000]
    assert (probes["met"] == (probes["attainment"] >= 0.9)).all()
    assert (probes["requests"] == 40).all()
    # The goodput is the highest rate probed that met the target, and the bracket's top
    # the lowest that missed.
    assert found.goodput_rps == probes.loc[probes["met"], "rate_rps"].max()
    assert found.bracket == (found.goodput_rps, probes.loc[~probes["met"], "rate_rps"].min())
    assert found.status in ("converged", "budget") and found.line.startswith("goodput ")
    assert found.report["probes"] == probes.to_dict("records")
    assert {p.name for p in tmp_path.iterdir()} == {"goodput.md", "goodput.csv", "goodput.json"}
    assert json.loads((tmp_path / "goodput.json").read_text())["goodput_rps"] == found.goodput_rps


def test_a_capacity_search_refuses_a_config_it_cannot_search(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="executor=model"):
        goodput(["model=tiny", "workload=synthetic"], 0.5, 0.05, out=tmp_path)
