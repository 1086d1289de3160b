"""The capacity search under conditions on a run's metrics (`python -m experiments.goodput
--slo 'METRIC<=X'`, `goodput_search.find_capacity`): conditions read as typed or refused in
one line, judged on a probe's metrics, a search on functions, and one search end to end on
the tiny model's simulated runs, its report and its MLflow run. (DistServe's attainment
form: tests/test_goodput.py.)"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from framework.run.errors import UserError
from framework.studies.goodput import main
from framework.studies.goodput_report import mlflow_key
from framework.studies.goodput_search import find_capacity
from framework.studies.slo import (
    OPERATORS,
    PROBE_KEYS,
    Condition,
    check,
    metric_names,
    parse_condition,
)
from tests.helpers import SMALL, assert_refused


# ---- conditions ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tbt_p99<=0.1", Condition("tbt_p99_s", "<=", 0.1)),
        ("tbt_p99_s<=0.1", Condition("tbt_p99_s", "<=", 0.1)),
        ("scheduling_delay_p50 <= 2", Condition("scheduling_delay_p50_s", "<=", 2.0)),
        (" ttft_p90<0.4 ", Condition("ttft_p90_s", "<", 0.4)),
        ("served_ratio>=0.8", Condition("served_ratio", ">=", 0.8)),
        ("mean_rows>7", Condition("mean_rows", ">", 7.0)),
        ("normalized_latency<=1e-3", Condition("normalized_latency_s", "<=", 0.001)),
        ("kv_wait_s_p99<=-0.5", Condition("kv_wait_s_p99", "<=", -0.5)),
        ("load_imbalance<1.5", Condition("load_imbalance", "<", 1.5)),
    ],
)
def test_a_condition_reads_as_typed(text: str, expected: Condition) -> None:
    assert parse_condition(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tbt_p99", "not a condition; --slo takes METRIC OP NUMBER, OP one of <=, <, >=, >"),
        ("tbt_p99=<0.1", "not a condition"),
        ("tbt_p99==0.1", "not a condition"),
        ("<=0.1", "not a condition"),
        ("tbt_p99<=", "not a condition"),
        ("tbt_p99<=x", "'x' is not a number"),
        ("tbt_p99<=inf", "the bound must be a finite number"),
        ("tbt_p99<=nan", "the bound must be a finite number"),
        ("itl_p99<=0.1", "no metric itl_p99"),
        ("attainment>=0.9", "no metric attainment"),  # DistServe's: --ttft, --tpot
    ],
)
def test_a_bad_condition_is_refused_naming_the_flag(text: str, expected: str) -> None:
    with pytest.raises(UserError, match=r"^--slo ") as caught:
        parse_condition(text)
    message = str(caught.value)
    assert expected in message and "\n" not in message
    if "no metric" in message:  # what it takes: every metric, named
        assert all(name in message for name in metric_names())


def test_the_metrics_a_condition_may_name() -> None:
    names = metric_names()
    assert len(set(names)) == len(names)
    for key in (
        "tbt_p50_s", "tbt_p99_s", "normalized_latency_s", "scheduling_delay_p50_s",
        "scheduling_delay_p99_s", "scheduling_delay_mean_s", "mean_rows", "ttft_p90_s",
        "tpot_p90_s", "requests_rejected", "kv_wait_s_p99", "load_imbalance", *PROBE_KEYS,
    ):  # fmt: skip
        assert key in names, key
    assert not {"itl_p50_s", "itl_p99_s", "clock", "executor", "replicas"} & set(names)


@given(
    metric=st.sampled_from(metric_names()),
    op=st.sampled_from(list(OPERATORS)),
    bound=st.floats(allow_nan=False, allow_infinity=False),
    spaced=st.booleans(),
)
def test_a_condition_reads_back_from_its_own_text(
    metric: str, op: str, bound: float, spaced: bool
) -> None:
    c = Condition(metric, op, bound)
    assert parse_condition(str(c) if spaced else c.text) == c
    if metric.endswith("_s"):  # and with its `_s` left off
        assert parse_condition(f"{metric[:-2]}{op}{bound!r}") == c


@given(
    op=st.sampled_from(list(OPERATORS)),
    bound=st.floats(-1e6, 1e6),
    value=st.floats(-1e6, 1e6),
)
def test_a_condition_holds_as_its_operator_says(op: str, bound: float, value: float) -> None:
    c = Condition("tbt_p99_s", op, bound)
    assert c.holds(value) == OPERATORS[op](value, bound)
    assert c.holds(bound) == (op in ("<=", ">="))  # the boundary: only the closed forms
    assert not c.holds(None) and not c.holds(math.nan)  # undefined meets nothing


def test_conditions_judged_on_a_probes_metrics() -> None:
    conditions = [parse_condition("scheduling_delay_p50<=2"), parse_condition("tbt_p99<=0.1")]
    checks = check(conditions, {"scheduling_delay_p50_s": 2.0, "tbt_p99_s": 0.25, "x": 1})
    assert [(c.value, c.passed) for c in checks] == [(2.0, True), (0.25, False)]
    undefined = check(conditions, {"scheduling_delay_p50_s": None, "tbt_p99_s": 0.0})
    assert [(c.value, c.passed) for c in undefined] == [(None, False), (0.0, True)]
    with pytest.raises(UserError, match="wrote no tbt_p99_s"):
        check(conditions, {"scheduling_delay_p50_s": 1.0})


# ---- the search ---------------------------------------------------------------------------
def test_the_search_needs_every_condition_to_hold() -> None:
    """Two conditions that give way at different rates (the delay at 40 req/s, the gaps at
    25): the capacity is where the first gives way, and each probe keeps both checks."""

    def prober(rate: float) -> dict[str, float]:
        return {"scheduling_delay_p50_s": rate / 20, "tbt_p99_s": rate / 250}

    conditions = [parse_condition("scheduling_delay_p50<=2"), parse_condition("tbt_p99<0.1")]
    r = find_capacity(prober, conditions, 1.0, tolerance=0.01)
    assert r.status == "converged" and r.conditions == tuple(conditions)
    assert r.goodput == r.low and r.low < 25 <= r.high and r.width is not None
    assert r.width <= 0.01
    for p in r.probes:
        assert [c.value for c in p.checks] == [p.rate / 20, p.rate / 250]
        assert p.passed == (p.rate / 20 <= 2 and p.rate / 250 < 0.1)
    assert [p.rate for p in r.probes[:6]] == [1, 2, 4, 8, 16, 32]  # bracketed, then bisected
    assert all(16 < p.rate < 32 for p in r.probes[6:])
    with pytest.raises(ValueError, match="at least one condition"):
        find_capacity(prober, [], 1.0)


def test_a_search_on_the_tiny_model_brackets_and_bisects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sarathi-Serve's form of SLO on simulated runs: the median scheduling delay, nil at
    10 req/s (each request finds the engine idle) and tens of milliseconds in a burst of 40
    requests at 100,000 req/s, and the P99 time between tokens; then bisection. Every figure
    comes from real runs; the search is logged to MLflow, a child run per probe."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    args = ["--slo", "scheduling_delay_p50<=0.001", "--slo", "tbt_p99 <= 0.01"]
    args += ["--low", "10", "--high", "100000", "--tolerance", "1", "--max-probes", "6"]
    args += ["--out", str(out), "--json", *SMALL, f"mlflow.tracking_uri={store}"]
    status = main(args)
    got = capsys.readouterr()
    assert status == 0, got.err[-3000:]
    data = json.loads(got.out)  # the JSON alone: the store's line went to stderr
    assert [c["text"] for c in data["conditions"]] == [
        "scheduling_delay_p50_s<=0.001",
        "tbt_p99_s<=0.01",
    ]
    assert data["ttft_s"] is None and data["attainment"] is None
    assert data["line"].startswith("goodput ") and data["line"].endswith(
        "at scheduling_delay_p50_s <= 0.001 and tbt_p99_s <= 0.01"
    )
    probes = data["probes"]
    assert [p["rate_rps"] for p in probes[:3]] == [10, 100000, 1000]  # the geometric middle
    assert probes[0]["met"] and not probes[1]["met"] and 4 <= len(probes) <= 6
    for row in probes:
        delay_ok = row["scheduling_delay_p50_s"] <= 0.001
        tbt_ok = row["tbt_p99_s"] <= 0.01
        assert row["scheduling_delay_p50_s<=0.001"] == delay_ok
        assert row["tbt_p99_s<=0.01"] == tbt_ok and row["met"] == (delay_ok and tbt_ok)
        assert row["requests"] == 40 and row["served_ratio"] > 0
    met = [p["rate_rps"] for p in probes if p["met"]]
    low, high = data["bracket"]
    assert data["goodput_rps"] == low == max(met)
    assert high == min(p["rate_rps"] for p in probes if not p["met"] and p["rate_rps"] > low)
    assert data["status"] in ("converged", "budget")
    # Every number of each probe's metrics.json is in the JSON report and names a metric,
    # but the start-up's seconds (this machine's wall clock, before the run's own clock).
    numbers = {k for k, v in probes[0].items() if isinstance(v, int | float)}
    verdicts = {"probe", "rate_rps", "met", *(c["text"] for c in data["conditions"])}
    startup = {"startup_load_s", "startup_observers_s"}
    assert startup <= numbers
    unnamed = numbers - verdicts - startup - set(metric_names())
    assert not unnamed, unnamed
    with (out / "goodput.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[:7] == [
        "probe", "rate_rps", "met", "scheduling_delay_p50_s", "scheduling_delay_p50_s<=0.001",
        "tbt_p99_s", "tbt_p99_s<=0.01",
    ]  # fmt: skip
    assert "attainment" not in table[0] and len(table) == len(probes)
    assert (out / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = MlflowClient(store).search_runs(
        [e.experiment_id for e in MlflowClient(store).search_experiments()]
    )
    (parent,) = [r for r in runs if r.data.tags.get("nanoserve.kind") == "goodput"]
    assert parent.data.metrics["goodput_rps"] == data["goodput_rps"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(probes)
    for child in children:
        row = next(p for p in probes if repr(p["rate_rps"]) == child.data.params["rate_rps"])
        assert child.data.metrics["tbt_p99_s"] == pytest.approx(row["tbt_p99_s"])
        assert child.data.metrics[mlflow_key("tbt_p99_s<=0.01")] == row["tbt_p99_s<=0.01"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--slo", "tbt_p99"], "--slo 'tbt_p99': not a condition"),
        (["--slo", "tbt_p99<=0.1", "--slo", "itl_p99<=0.1"], "no metric itl_p99"),
        (["--slo", "tbt_p99<=fast"], "'fast' is not a number"),
        (["--slo", "load_imbalance<=1.5"], "wrote no load_imbalance"),  # one engine's run
    ],
)
def test_a_bad_condition_on_the_command_line_is_one_line_and_exit_2(
    args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([*args, "--out", str(tmp_path / "out"), "--no-mlflow", *SMALL])
    err = capsys.readouterr().err
    assert_refused(status, err, expected)
    if "no metric" in expected:
        assert "tbt_p99_s, " in err and "scheduling_delay_p50_s" in err
    assert not (tmp_path / "out").exists()
