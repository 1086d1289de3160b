"""The simulator check runs end to end on the tiny model and writes every column it promises;
on every closed loop the simulated counts equal the real ones. No time is asserted: how close
the seconds come is what the check measures, on the machine that runs it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.sim import (
    check_cases,
    check_machine,
    check_noise,
    check_rows,
    check_sides,
    sim_check,
)
from framework.executors.simulated.cost import model_id
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.profile import LinearCost, MeasuredProfile
from framework.run.config import MlflowConfig
from framework.run.paths import DEFAULT_TRACE
from framework.tracking.store import TrackingStore


def tiny_profile(path: Path, tiny: tuple) -> Path:
    """A hand-made profile for the tiny model: the check must not depend on a calibration
    (its own test is tests/test_calibrate.py), only on a profile that loads."""
    model, _ = tiny
    meta = {"model_id": model_id(model.config), "model": "tiny", "dtype": "float32"}
    forward = LinearCost(1e-3, {"linear_tokens": 1e-5, "decode_ctx": 1e-8})
    MeasuredProfile(meta, forward, LinearCost(5e-5, {"rows": 1e-6})).write(path)
    return path


def rows_of(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open() as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_sim_check_runs_on_the_tiny_model(
    tmp_path: Path, tiny: tuple, capsys: pytest.CaptureFixture[str]
) -> None:
    # The Azure workloads need the trace beside the repository (../shared, as in CI).
    has_trace = DEFAULT_TRACE.is_file()
    workloads = check_cases.WORKLOADS if has_trace else ("straggler",)
    profile = tiny_profile(tmp_path / "tiny.yaml", tiny)
    out = sim_check.main(
        [
            "--quick",
            "--rounds",
            "1",
            "--threads",
            "1",
            "--profile",
            str(profile),
            "--workloads",
            ",".join(workloads),
            "--speed",
            "auto",  # the canaries' speed: the path a slow shared VM is checked with
            "--out",
            str(tmp_path / "out"),
        ]
    )
    report = (out / "sim_check.md").read_text()
    assert "- speed: executor.speed " in report
    assert "- prefill probe: 128-token prefill" in report
    assert f"The same real runs against {check_machine.SHIPPED}:" in report
    assert f"The same real runs against {check_machine.OWN}:" in report
    columns, rows = rows_of(out / "sim_check.csv")
    assert columns == list(check_rows.COLUMNS)
    combos = check_cases.policy_combos(quick=True)
    expected = [check_cases.Case("straggler", c, True).name for c in combos]
    if has_trace:
        expected += [check_cases.Case("azure_closed", c, True).name for c in combos]
        expected += ["tight_pool continuous/incremental/immediate"]
        expected += [f"azure_open_{x} continuous/incremental/immediate" for x in ("0.5", "0.9")]
    assert [r["case"] for r in rows] == expected
    for r in rows:
        if r["closed_loop"] == "True":
            assert r["counts_equal"] == "True", r
            for k in check_rows.COUNTS:
                assert r[f"{k}_real"] == r[f"{k}_sim"], (r["case"], k)
        assert r["makespan_real"] and r["makespan_sim"] and r["e2e_mape"], r
        for m in check_rows.METRICS:
            assert r[f"{m}_verdict"] in ("met", "within real spread", "not met", "-"), r
    if has_trace:  # the tight pool does what it is for
        tight = next(r for r in rows if r["workload"] == "tight_pool")
        assert int(tight["preemptions_real"]) > 0 and int(tight["recomputed_tokens_real"]) > 0

    step_cols, steps = rows_of(out / "sim_check_steps.csv")
    assert step_cols == list(check_rows.STEP_COLUMNS)
    assert {s["case"] for s in steps} == set(expected)
    pair_cols, pairs = rows_of(out / "sim_check_pairs.csv")
    assert pair_cols == list(check_rows.PAIR_COLUMNS)
    closed = {r["case"]: int(r["steps_real"]) for r in rows if r["closed_loop"] == "True"}
    assert {c: sum(p["case"] == c for p in pairs) for c in closed} == closed  # one per step
    md = (out / "sim_check.md").read_text()
    sections = ("## Targets", "## Twins", "## Counts", "## Times", "## Where the seconds go")
    for section in sections:
        assert section in md
    assert "machine: " in md and "commit: " in md and str(profile) in md
    assert "MLflow: logged run" in capsys.readouterr().out

    store = TrackingStore(MlflowConfig())
    found = store.find_run("nanoserve.kind", "sim_check")
    assert found is not None and found[1]["mlflow.source.name"] == "experiments/sim_check.py"
    children = store.client.search_runs(
        [store.experiment_id()], filter_string=f"tags.`mlflow.parentRunId` = '{found[0]}'"
    )
    assert sorted(c.data.tags["sim_check.case"] for c in children) == sorted(expected)


def test_the_compute_speed_predicts_the_prefill_probe_as_measured() -> None:
    """probe = M / speed + C / compute_speed: a profile that puts 0.05 s of the probe on
    memory and 0.15 s on compute, a machine at half its memory speed and 3/4 of its compute
    speed takes 0.1 + 0.2 = 0.3 s, 50% over the profile's 0.2 s; from that slowdown and the
    memory speed the compute speed comes back."""
    machine = object.__new__(check_machine.Machine)
    machine.prefill_predicted = (0.2, 0.15)
    assert machine.compute_speed(0.5, 0.5) == pytest.approx(0.75)
    assert machine.compute_speed(1.0, 0.0) == pytest.approx(1.0)  # a quiet machine
    machine.prefill_predicted = (0.2, 0.0)  # nothing of the probe on compute
    assert machine.compute_speed(0.5, 0.5) is None


def twin_case(
    scheduler: str, allocator: str, features: list[StepFeatures], real: float, sim: float
) -> tuple[check_sides.Runs, dict]:
    """A case's runs (only what finding twins reads) and a report row with its makespan."""
    case = check_cases.Case("azure_closed", (scheduler, allocator, "immediate"), True)
    runs = check_sides.Runs(case, [], features=features)
    row = {"case": case.name, "counts_equal": True, "makespan_real": real}
    row |= {"makespan_sim": sim, "makespan_error": sim / real - 1}
    row["makespan_verdict"] = check_rows.verdict(row["makespan_error"], 0.02, 0.05)
    return runs, row


def test_twins_are_the_cases_that_took_the_same_steps() -> None:
    """Static batching under both allocators took the same two steps; continuous batching
    other ones. The static twins' real medians lie 10% apart (1.9 and 2.1 around 2.0), so the
    one simulation of their steps (2.1) misses the first by 10.5% and meets the second: that
    miss is within the twins' distance apart, which the report says."""
    a = StepFeatures(2, 20, 32, 2, 20, 200, 0, 0, 0)
    b = StepFeatures(2, 2, 16, 0, 0, 0, 2, 22, 0)
    cases = [
        twin_case("continuous", "incremental", [a, b, b], 3.0, 3.0),
        twin_case("static", "worst_case", [a, b], 1.9, 2.1),
        twin_case("static", "incremental", [a, b], 2.1, 2.1),
    ]
    runs, rows = [r for r, _ in cases], [row for _, row in cases]
    assert [row["makespan_verdict"] for row in rows] == ["met", "not met", "met"]
    twins = check_noise.twin_rows(runs, rows, ["makespan"])
    assert [t["cases"] for t in twins] == [[rows[1]["case"], rows[2]["case"]]]
    assert twins[0]["steps"] == 2
    assert twins[0]["makespan_apart"] == pytest.approx(0.2 / 2.0)
    assert twins[0]["makespan_error_max"] == pytest.approx(2.1 / 1.9 - 1)
    assert check_noise.misses_inside(twins, rows, ["makespan"], check_rows.NOT_MET) == (0, 1)
    rows[2]["makespan_real"] = 2.4  # twins further apart than the miss
    twins = check_noise.twin_rows(runs, rows, ["makespan"])
    assert check_noise.misses_inside(twins, rows, ["makespan"], check_rows.NOT_MET) == (1, 1)
    # Counts that differ from the simulation's, or another output policy: not twins.
    rows[2]["counts_equal"] = False
    assert check_noise.twin_rows(runs, rows, ["makespan"]) == []
    lines = check_noise.section([], rows, ["makespan"], check_rows.NOT_MET)
    assert lines[-1] == "No two cases took the same steps in this check."
