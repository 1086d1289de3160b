"""Goodput under DistServe's SLO (`python -m experiments.goodput --ttft S --tpot S`): the
attainment of hand-built requests, the search on attainment functions whose threshold is
known, one small search end to end on the tiny model's simulated runs, and bad input refused
in one line. (Conditions on a run's metrics: tests/test_capacity.py.)"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import Sequence, Status
from framework.studies.goodput import main
from framework.studies.goodput_report import sustained_warning
from framework.studies.goodput_search import CapacityResult, find_capacity
from framework.studies.slo import attainment, attainment_condition, slo_met
from tests.helpers import SMALL, assert_refused

TTFT, TPOT = 0.5, 0.0625  # binary fractions: the boundary cases below are exact


def seq(
    arrival: float,
    first: float | None,
    done: float | None,
    tokens: int,
    status: Status = Status.RELEASED,
) -> Sequence:
    """A request as a finished run leaves it: arrival, first token, finish, output tokens."""
    spec = RequestSpec(f"r{arrival}", [1, 2, 3], SamplingParams(max_tokens=max(tokens, 1)), arrival)
    s = Sequence(spec, eos_token_id=None, status=status)
    s.first_token_at, s.finished_at = first, done
    s.output_token_ids = list(range(tokens))
    return s


def test_attainment_counts_every_request_and_judges_both_targets() -> None:
    seqs = [
        seq(1.0, 1.5, 1.75, 5),  # TTFT 0.5, TPOT 0.0625: both exactly on target, met
        seq(0.0, 0.1, 0.1 + 9 * 0.05, 10),  # well inside, met
        seq(0.0, 0.6, 0.7, 3),  # TTFT 0.6 misses
        seq(0.0, 0.2, 0.2 + 4 * 0.07, 5),  # TPOT 0.07 misses
        seq(2.0, 2.3, 2.3, 1),  # one token: no TPOT, TTFT alone decides; met
        seq(2.0, 2.7, 2.7, 1),  # one token, TTFT 0.7 misses
        seq(0.0, None, None, 0, Status.REJECTED),  # rejected: a miss, not left out
        seq(0.0, 0.1, None, 2, Status.RUNNING),  # unfinished when the run ended: a miss
    ]
    met = [True, True, False, False, True, False, False, False]
    assert slo_met(seqs, TTFT, TPOT).tolist() == met
    assert attainment(seqs, TTFT, TPOT) == pytest.approx(3 / 8)
    assert attainment(seqs, 10.0, 10.0) == pytest.approx(6 / 8)
    assert attainment([], TTFT, TPOT) == 0.0


def search_attainment(
    share: Callable[[float], float],
    low: float,
    high: float,
    target: float,
    tolerance: float,
    *,
    growth: float = 2.0,
    max_probes: int = 20,
) -> CapacityResult:
    """The search under DistServe's pass rule, on a function from a rate to an attainment."""

    def probe(rate: float) -> dict[str, float]:
        return {"attainment": share(rate)}

    condition = attainment_condition(target)
    return find_capacity(
        probe, [condition], low, high, tolerance=tolerance, growth=growth, max_probes=max_probes
    )


def rates(r: CapacityResult) -> list[float]:
    return [p.rate for p in r.probes]


def logistic(threshold: float) -> tuple[float, Callable[[float], float]]:
    """A smooth monotone attainment, 1 at low rates and 0 at high ones, and the rate at
    which it crosses 0.9."""

    def f(rate: float) -> float:
        return 1 / (1 + math.exp(rate - threshold))

    return threshold - math.log(9), f


@pytest.mark.parametrize(("low", "high"), [(1.0, 2.0), (0.5, 100.0), (30.0, 40.0)])
def test_search_finds_a_monotone_threshold_within_tolerance(low: float, high: float) -> None:
    crossing, f = logistic(20.0)  # crosses 0.9 at 17.8
    calls: list[float] = []

    def probe(rate: float) -> float:
        calls.append(rate)
        return f(rate)

    r = search_attainment(probe, low, high, 0.9, 0.01, max_probes=40)
    assert r.status == "converged"
    assert r.low == r.goodput and r.low <= crossing <= r.high
    assert (r.high - r.low) / r.low <= 0.01
    assert f(r.low) >= 0.9 > f(r.high)
    assert rates(r) == calls and len(set(calls)) == len(calls)
    assert [p.metrics["attainment"] for p in r.probes] == [f(rate) for rate in calls]


def test_search_on_a_step_function() -> None:
    def step(rate: float) -> float:
        return 0.95 if rate <= 3.7 else 0.4

    r = search_attainment(step, 10.0, 20.0, 0.9, 0.05)
    assert r.status == "converged"
    assert r.goodput is not None and r.goodput <= 3.7 < r.high
    assert r.width is not None and r.width <= 0.05
    # The bracket came from below: 10 missed, then 5, then 2.5 met.
    assert rates(r)[:3] == [10.0, 5.0, 2.5]


def test_bracket_grows_geometrically_until_a_probe_misses() -> None:
    r = search_attainment(lambda rate: 1.0 if rate < 100 else 0.0, 1.0, 2.0, 0.9, 0.05)
    assert rates(r)[:8] == [1, 2, 4, 8, 16, 32, 64, 128]  # 128: the first miss
    assert 64 <= r.goodput < 100 <= r.high <= 128 and r.status == "converged"
    # Another growth factor; a budget spent while the bracket is still open (above, below)
    # or before the tolerance is reached.
    grown = search_attainment(
        lambda rate: 1.0 if rate < 100 else 0.0, 1.0, 2.0, 0.9, 0.05, growth=10
    )
    assert rates(grown)[:4] == [1, 2, 20, 200]
    assert 20 <= grown.goodput < 100 <= grown.high <= 200
    above = search_attainment(lambda rate: 1.0, 1.0, 2.0, 0.9, 0.05, max_probes=5)
    assert (above.status, above.goodput, above.low, above.high) == ("above", 16, 16, None)
    assert len(above.probes) == 5
    one = search_attainment(lambda rate: 1.0, 1.0, 2.0, 0.9, 0.05, max_probes=1)
    assert (one.status, one.goodput, len(one.probes)) == ("above", 1, 1)
    below = search_attainment(lambda rate: 0.0, 1.0, 2.0, 0.9, 0.05, max_probes=4)
    assert (below.status, below.goodput, below.low, below.high) == ("below", None, None, 0.125)
    budget = search_attainment(
        lambda rate: 1.0 if rate < 100 else 0.0, 1.0, 2.0, 0.9, 1e-9, max_probes=12
    )
    assert budget.status == "budget" and len(budget.probes) == 12 and budget.low <= 100


def test_search_refuses_an_empty_bracket() -> None:
    with pytest.raises(ValueError, match="0 < low < high"):
        search_attainment(lambda rate: 1.0, 2.0, 2.0, 0.9, 0.05)


def test_goodput_end_to_end_on_the_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas behind a router, a bracket wide enough to hold a probe that meets the
    SLO (10 req/s is light load) and one that does not (100,000 req/s is a burst), and a
    budget of four runs: whatever the search ends on, every figure comes from real runs."""
    args = ["--ttft", "0.001", "--tpot", "0.0005", "--low", "10", "--high", "100000"]
    args += ["--tolerance", "1", "--max-probes", "4", "--out", str(tmp_path), "--json"]
    args += ["--no-mlflow"]
    status = main([*args, *SMALL, "cluster.replicas=2", "router=least_tokens"])
    out = capsys.readouterr()
    assert status == 0, out.err[-3000:]
    data = json.loads(out.out)
    assert data["goodput_rps"] >= 10 and data["status"] in ("converged", "budget")
    assert data["replicas"] == 2 and data["clock"] == "virtual"
    assert data["cost_model"] == "analytic" and data["hardware"]
    assert data["line"].startswith(f"goodput {data['goodput_rps']:.4g} req/s (bracket [")
    probes = data["probes"]
    assert 3 <= len(probes) <= 4 and [p["rate_rps"] for p in probes[:2]] == [10, 100000]
    for row in probes:
        assert row["requests"] == 40 and row["met"] == (row["attainment"] >= 0.9)
        assert row["attainment>=0.9"] == row["met"]  # the one condition, its own column
        assert min(row["ttft_met"], row["tpot_met"]) >= row["attainment"]
    assert probes[0]["met"] and not probes[1]["met"]
    assert data["conditions"] == [
        {"metric": "attainment", "op": ">=", "bound": 0.9, "text": "attainment>=0.9"}
    ]
    met = [p["rate_rps"] for p in probes if p["met"]]
    assert data["goodput_rps"] == max(met)
    files = {"goodput.md", "goodput.csv", "goodput.json", "goodput.png"}
    assert {p.name for p in tmp_path.iterdir()} == files
    assert "simulated seconds" in (tmp_path / "goodput.md").read_text()
    assert len((tmp_path / "goodput.csv").read_text().splitlines()) == len(probes) + 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--ttft", "0.5", "--tpot", "0.05", "model=tiny", "workload=synthetic"], "executor=model"),
        (["--ttft", "0", "--tpot", "0.05", *SMALL], "--ttft must be > 0; got 0"),
        (["--ttft", "-1", "--tpot", "0.05", *SMALL], "--ttft must be > 0; got -1"),
        (["--ttft", "0.5", "--tpot", "x", *SMALL], "--tpot must be a number; got 'x'"),
        (["--tpot", "0.05", *SMALL], "argument --tpot needs --ttft"),
        (SMALL, "no SLO: give --slo 'METRIC<=X'"),
        (["--slo", "tbt_p99<=1", "--attainment", "0.8", *SMALL], "argument --attainment: it is"),
        (["--ttft", "1", "--tpot", "1", "--attainment", "1.5", *SMALL], "must be in (0, 1]"),
        (["--ttft", "1", "--tpot", "1", "--low", "4", "--high", "2", *SMALL], "below --high"),
        (
            ["--ttft", "1", "--tpot", "1", "executor=simulated", "model=tiny", "workload=chat"],
            "workload=chat: no request rate to search",
        ),
        (["--ttft", "1", "--tpot", "1", *SMALL, "workload.arrival=burst"], "arrival=burst"),
        (
            [
                "--ttft",
                "1",
                "--tpot",
                "1",
                "executor=simulated",
                "model=tiny",
                "workload=multiturn",
            ],
            "counts conversations per second",
        ),
        (["--ttft", "1", "--tpot", "1", *SMALL, "model=nope"], "model=nope: no such choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([*args, "--out", str(tmp_path / "out")])
    assert_refused(status, capsys.readouterr().err, expected)
    assert not (tmp_path / "out").exists()


def test_a_goodput_the_run_did_not_keep_up_with_is_flagged() -> None:
    rows = [
        {"rate_rps": 4.0, "throughput_rps": 3.9, "served_ratio": 0.975, "requests": 400},
        {"rate_rps": 45.0, "throughput_rps": 11.0, "served_ratio": 11 / 45, "requests": 400},
    ]
    assert sustained_warning(rows, 4.0) is None
    assert sustained_warning(rows, None) is None
    warning = sustained_warning(rows, 45.0)
    assert warning is not None and "served 11 req/s of the 45 offered (24%)" in warning
    assert "twice the requests" in warning
