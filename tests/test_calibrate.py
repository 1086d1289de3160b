"""Calibration: the tiny model's quick grid writes a profile that loads back and predicts the
same; the fit recovers known costs; predictions are never negative; a malformed profile is
one error naming its field. (No measured time is asserted: that is the machine's.)"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

from framework.calibration import calibrate, fitting
from framework.calibration import grid as calibration_grid
from framework.calibration import point_run as points
from framework.executors.packed_linear import rows_bucket
from framework.executors.simulated.cost import FORMAT, ProfileError
from framework.executors.simulated.features import NAMES, StepFeatures
from framework.executors.simulated.linear_cost import DERIVED, LinearCost, is_compute, term_value
from framework.executors.simulated.load import load_cost_model
from framework.executors.simulated.profile import MeasuredProfile, Sample, fit_host, nnls
from framework.tracking.machine import ISA


def features(
    prefill: Sequence[int] = (),
    decode_ctx: Sequence[int] = (),
    random_rows: int = 0,
) -> StepFeatures:
    """A step's features by hand: prompts (whole, at position 0) and decode rows' contexts."""
    tokens = sum(prefill) + len(decode_ctx)
    return StepFeatures(
        rows=len(prefill) + len(decode_ctx),
        num_tokens=tokens,
        linear_tokens=tokens,
        prefill_rows=len(prefill),
        prefill_tokens=sum(prefill),
        prefill_attn=sum(p * p for p in prefill),
        decode_rows=len(decode_ctx),
        decode_ctx=sum(decode_ctx),
        random_rows=random_rows,
    )


def synthetic_steps(rng: np.random.Generator, n: int) -> list[StepFeatures]:
    out = []
    for _ in range(n):
        prompts = [int(x) for x in rng.integers(4, 600, size=rng.integers(0, 4))]
        ctx = [int(x) for x in rng.integers(8, 1500, size=rng.integers(0 if prompts else 1, 48))]
        out.append(features(prompts, ctx, int(rng.integers(0, len(prompts) + len(ctx) + 1))))
    return out


TRUE = LinearCost(
    0.030,
    {
        "linear_tokens": 2.0e-4,
        "linear_tokens>64": 1.0e-3,
        "rows": 4.0e-4,
        "prefill_attn": 6.0e-7,
        "decode_ctx": 2.5e-6,
    },
)


def test_the_fit_recovers_known_coefficients_and_reports_holdout_error() -> None:
    rng = np.random.default_rng(0)
    steps = synthetic_steps(rng, 600)
    samples = [
        Sample(
            f,
            TRUE.seconds(f) * (1 + 0.01 * rng.standard_normal()),
            (5e-5 + 3e-6 * f.rows + 2e-4 * f.random_rows) * (1 + 0.01 * rng.standard_normal()),
            f"g{i % 10}",
        )
        for i, f in enumerate(steps)
    ]
    prof = MeasuredProfile.fit(
        samples,
        {"model": "synthetic"},
        forward_terms=[*TRUE.per, "prefill_rows"],  # one term the truth does not have
        holdout=["g0", "g1"],
    )
    # Within 10%: rows and linear_tokens are nearly collinear (equal in a decode step), so
    # 1% noise trades a little of one for the other.
    assert prof.forward.intercept_s == pytest.approx(TRUE.intercept_s, rel=0.1)
    for term, coef in TRUE.per.items():
        assert prof.forward.per[term] == pytest.approx(coef, rel=0.1), term
    assert prof.forward.per["prefill_rows"] < 1e-3 * TRUE.intercept_s
    assert prof.sample.per["random_rows"] == pytest.approx(2e-4, rel=0.05)
    r = prof.fit_report
    assert (r["points"], r["holdout_points"]) == (480, 120)
    assert (r["groups"], r["holdout_groups"]) == (8, 2)
    assert r["forward_holdout_mape"] < 0.02
    assert r["forward_holdout_run_max"] < 0.02


def test_held_out_groups_do_not_move_the_fit() -> None:
    rng = np.random.default_rng(1)
    steps = synthetic_steps(rng, 200)
    clean = [Sample(f, TRUE.seconds(f), 1e-4, "fit") for f in steps]
    wild = [Sample(f, 50 * TRUE.seconds(f), 1.0, "held") for f in steps[:20]]
    terms = list(TRUE.per)
    a = MeasuredProfile.fit(clean, {}, forward_terms=terms)
    b = MeasuredProfile.fit(clean + wild, {}, forward_terms=terms, holdout=["held"])
    assert a.forward == b.forward
    assert b.fit_report["forward_holdout_mape"] > 0.9  # predicted 1/50 of the wild times


def test_predictions_are_never_negative() -> None:
    # The data want a negative slope on decode_ctx: unconstrained least squares would
    # predict less than nothing for a long enough context.
    steps = [features([], [c] * 4) for c in range(16, 2000, 16)]
    samples = [Sample(f, 0.05 - 1e-5 * f.decode_ctx / 4, 1e-4, "g") for f in steps]
    prof = MeasuredProfile.fit(samples, {}, forward_terms=["decode_ctx", "decode_rows", "rows"])
    assert all(c >= 0 for c in prof.forward.per.values()) and prof.forward.intercept_s >= 0
    rng = np.random.default_rng(2)
    extremes = [
        features(),
        features([1]),
        features([], [10**6] * 512),
        features([8192] * 8, [4096] * 256, 264),
        *synthetic_steps(rng, 200),
    ]
    for f in extremes:
        cost = prof.predict(f)
        assert cost.forward_s >= 0 and cost.sample_s >= 0
    # Whatever the coefficients, a sum below zero is clipped.
    odd = LinearCost(-1.0, {"rows": -1.0})
    assert odd.seconds(features([4], [9, 9])) == 0.0


def test_nnls_matches_the_unconstrained_solution_when_it_is_non_negative() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0, 1, size=(50, 4))
    x = np.array([0.5, 2.0, 0.0, 1.5])
    got = nnls(a, a @ x)
    assert np.allclose(got, x, atol=1e-8)


def test_the_prepare_cost_is_fitted_on_absolute_seconds_and_kept_in_the_file() -> None:
    """The real executor's tensor preparation, which a simulated step under measured host
    time adds: fitted to keep the total (a run adds these up), reported on held-out steps,
    and written and read back with the profile; a profile without it prepares for free."""
    rng = np.random.default_rng(4)
    steps = synthetic_steps(rng, 400)
    truth = LinearCost(1.5e-4, {"rows": 4e-6, "num_tokens": 2e-7, "decode_ctx": 1e-8})
    samples = [
        Sample(f, TRUE.seconds(f), 1e-4, f"g{i % 8}", truth.seconds(f) * rng.uniform(0.9, 1.1))
        for i, f in enumerate(steps)
    ]
    prof = MeasuredProfile.fit(
        samples, {}, forward_terms=list(TRUE.per), prepare_terms=list(truth.per), holdout=["g0"]
    )
    assert prof.prepare.intercept_s == pytest.approx(truth.intercept_s, rel=0.1)
    for term, coef in truth.per.items():
        assert prof.prepare.per[term] == pytest.approx(coef, rel=0.1), term
    assert abs(prof.fit_report["prepare_holdout_total_error"]) < 0.02
    again = MeasuredProfile.from_dict(prof.to_dict())
    assert again.prepare == prof.prepare
    older = MeasuredProfile.from_dict(good_profile())
    assert older.prepare.seconds(features([100], [200, 300])) == 0.0
    # Without prepare terms nothing is fitted and nothing is reported.
    plain = MeasuredProfile.fit(samples, {}, forward_terms=list(TRUE.per), holdout=["g0"])
    assert plain.prepare == LinearCost() and "prepare_holdout_total_error" not in plain.fit_report


def test_host_cost_is_robust_to_a_slow_step() -> None:
    rows = [r for r in (1, 2, 4, 8, 16, 32) for _ in range(9)]
    secs = [4e-4 + 2e-5 * r for r in rows]
    secs[5] = 0.5  # a garbage collection, a neighbour's burst
    host = fit_host(rows, secs)
    assert host.per_step_s == pytest.approx(4e-4, rel=1e-6)
    assert host.per_row_s == pytest.approx(2e-5, rel=1e-6)


def test_quick_calibration_writes_a_profile_that_loads_back(tmp_path: Path) -> None:
    out, raw = tmp_path / "tiny.yaml", tmp_path / "steps.csv"
    args = calibrate.parse(["--quick", "--ungated", "--out", str(out), "--raw", str(raw)])
    profile, written = calibrate.run(args)
    assert written == out
    loaded = load_cost_model(out)
    assert isinstance(loaded, MeasuredProfile) and loaded.kind == "measured"
    with raw.open() as f:
        rows = list(csv.DictReader(f))
    grid = calibration_grid.quick_grid()
    assert {r["point"] for r in rows} == {p.name for p in grid}
    for r in rows:
        feat = StepFeatures(**{k: int(r[k]) for k in NAMES})
        assert loaded.predict(feat) == profile.predict(feat)
    assert loaded.host == profile.host and loaded.readback_s == profile.readback_s
    assert loaded.prepare == profile.prepare
    # The real executor's preparation is timed on every step, and priced by the profile.
    assert all(float(r["prepare_s"]) > 0 for r in rows)
    # Every run has the probes around it, which --drift probes (the default) fits by.
    assert all(float(r["probe_decode_s"]) > 0 and float(r["probe_prefill_s"]) > 0 for r in rows)
    assert profile.prepare.seconds(StepFeatures(**{k: int(rows[0][k]) for k in NAMES})) > 0

    data = yaml.safe_load(out.read_text())
    assert data["format"] == FORMAT and data["kind"] == "measured"
    meta = data["meta"]
    assert meta["model_id"].startswith("LlamaForCausalLM-L2-H64")
    assert meta["dtype"] == "float32" and meta["device"] == "cpu"
    assert set(meta["machine"]["isa"]) == set(ISA)
    assert meta["machine"]["threads"] >= 1 and meta["machine"]["cpu"]
    for key in ("model", "date", "commit", "grid", "kernels"):
        assert key in meta, key
    assert [g["name"] for g in meta["grid"]] == [p.name for p in grid]
    fit = data["fit"]
    assert fit["drift"] == "probes" and "measured_forward_holdout_mape" in fit
    assert fit["holdout_points"] > 0 and fit["points"] > fit["holdout_points"]
    assert set(data["prepare"]["per"]) == set(fitting.PREPARE_TERMS)
    for key in (
        "forward_holdout_mape",
        "forward_holdout_max",
        "sample_holdout_mape",
        "prepare_holdout_total_error",
    ):
        assert key in fit, key
    # The two probes' quiet references, which sim_check --speed auto divides by.
    assert fit["canary_best_s"] > 0 and fit["prefill_canary_best_s"] > 0
    # and their medians over the grid (a pair of probes after each point), never below the
    # quietest: the state the fit describes, which sim_check --speed auto compares with.
    assert fit["canary_grid_s"] >= fit["canary_best_s"]
    assert fit["prefill_canary_grid_s"] >= fit["prefill_canary_best_s"]
    # JSON says the same.
    profile.write(tmp_path / "tiny.json")
    again = load_cost_model(tmp_path / "tiny.json")
    assert again.forward == profile.forward and again.sample == profile.sample  # type: ignore[attr-defined]


def good_profile() -> dict[str, Any]:
    return {
        "format": FORMAT,
        "kind": "measured",
        "meta": {"model": "x"},
        "forward": {"intercept_s": 0.01, "per": {"linear_tokens": 1e-4, "decode_ctx>64": 1e-6}},
        "sample": {"intercept_s": 1e-5, "per": {"rows": 1e-6}},
        "readback_s": 1e-6,
        "host": {"per_step_s": 1e-4, "per_row_s": 1e-5},
    }


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("forward", "per", "linear_tokens"), "fast", "forward.per.linear_tokens"),
        (("forward", "per", "tokens_squared"), 1e-6, "forward.per.tokens_squared"),
        (("forward", "per", "decode_ctx>x"), 1e-6, "forward.per.decode_ctx>x"),
        (("forward", "intercept_s"), -0.5, "forward.intercept_s"),
        (("forward", "intercept_s"), None, "forward.intercept_s"),
        (("sample",), None, "sample"),
        (("sample",), [1, 2], "sample"),
        (("host", "per_row_s"), "1us", "host.per_row_s"),
        (("prepare",), {"intercept_s": 1e-4, "per": {"rows": -1.0}}, "prepare.per.rows"),
        (("readback_s",), float("nan"), "readback_s"),
    ],
)
def test_a_malformed_profile_names_the_field(
    tmp_path: Path, path: tuple[str, ...], value: Any, named: str
) -> None:
    data = good_profile()
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as err:
        load_cost_model(file)
    assert named in str(err.value)
    assert str(file) in str(err.value)


def test_a_good_profile_loads() -> None:
    prof = MeasuredProfile.from_dict(good_profile(), source="mem")
    f = features([100], [200, 300])
    cost = prof.predict(f)
    assert cost.forward_s == pytest.approx(0.01 + 1e-4 * 102 + 1e-6 * (500 - 64))
    # The per-token Linear work is compute bound; the intercept and the KV reads are not.
    assert cost.compute_s == pytest.approx(1e-4 * 102)


def test_the_fit_is_scaled_so_that_a_runs_sum_is_unbiased() -> None:
    """Noisy steps shrink a fit on relative error below the mean; a simulated run adds its
    steps up, so the fitted shape is scaled until the median run's sum is right."""
    rng = np.random.default_rng(5)
    steps = synthetic_steps(rng, 800)
    noise = rng.lognormal(0.0, 0.25, size=len(steps))  # skewed slow, as a shared VM is
    samples = [
        Sample(f, TRUE.seconds(f) * n, 1e-4 * n, f"g{i % 20}")
        for i, (f, n) in enumerate(zip(steps, noise, strict=True))
    ]
    prof = MeasuredProfile.fit(samples, {}, forward_terms=list(TRUE.per), holdout=["g0", "g1"])
    r = prof.fit_report
    assert r["forward_scale"] > 1.03  # the relative fit alone came out short
    assert abs(r["forward_train_run_bias"]) < 0.01
    assert abs(r["forward_holdout_run_bias"]) < 0.04
    # Without noise there is nothing to correct.
    clean = [Sample(f, TRUE.seconds(f), 1e-4, f"g{i % 5}") for i, f in enumerate(steps)]
    exact = MeasuredProfile.fit(clean, {}, forward_terms=list(TRUE.per))
    assert exact.fit_report["forward_scale"] == pytest.approx(1.0, abs=1e-6)


# A CPU fp32 step's cost with a prefill row's own price (its attention call in every layer),
# about as SmolLM2 measured here: what the full grid must be able to tell from its tokens.
ROW_PRICED = LinearCost(
    0.044,
    {
        "linear_tokens>8": 1.2e-3,
        "rows": 2.0e-4,
        "prefill_rows": 1.2e-3,
        "prefill_attn": 3.0e-7,
        "decode_ctx": 3.0e-6,
        "padded": 6.0e-3,
        "has_prefill": 2.0e-3,
    },
)


def prefill_step(rows: int, prompt: int) -> StepFeatures:
    f = features([prompt] * rows)
    return StepFeatures(**{**f.as_dict(), "linear_tokens": rows_bucket(f.num_tokens)})


def test_the_full_grid_prices_a_prefill_row_apart_from_its_tokens(tiny: Any) -> None:
    """Served on the tiny model for its schedule alone (each step's features), the full grid's
    fitted points priced by ROW_PRICED with 3% noise: fitted with the CPU terms, many short
    prompts at once (the straggler preset's 8 of 5 tokens) come out as right as a few long
    ones. The grid's short prompts are all 16 tokens, yet its long prompts and mixed steps
    separate a row from its tokens: over 8 seeds the worst of these steps was 0.6-2.1% off,
    and 13-15% with `prefill_rows` left out of the terms (what this test guards)."""
    model, tok = tiny
    loaded = (model, tok, torch.device("cpu"), torch.float32)
    rng = np.random.default_rng(0)
    samples = []
    for point in calibration_grid.full_grid():
        if point.holdout:
            continue
        for feat, *_ in points.serve_point(["model=tiny"], loaded, point, 0).steps:
            noisy = ROW_PRICED.seconds(feat) * float(rng.lognormal(0.0, 0.03))
            samples.append(Sample(feat, noisy, 1e-4, point.name))
    fitted = MeasuredProfile.fit(samples, {}, forward_terms=fitting.CPU_PACKED_TERMS).forward
    for rows, prompt in ((8, 5), (16, 3), (12, 5), (1, 40), (4, 16)):
        step = prefill_step(rows, prompt)
        error = fitted.seconds(step) / ROW_PRICED.seconds(step) - 1
        assert abs(error) < 0.04, (rows, prompt, error)


TERMS = [*NAMES, *DERIVED, *(f"{n}>{k}" for n in NAMES for k in (0, 8, 64))]


@given(
    per=st.dictionaries(
        st.sampled_from(TERMS),
        st.one_of(st.just(0.0), st.floats(1e-9, 1.0)),
        max_size=12,
    ),
    intercept=st.floats(0.0, 0.1),
    values=st.lists(
        st.integers(0, 80) | st.integers(0, 5000), min_size=len(NAMES), max_size=len(NAMES)
    ),
)
def test_a_cost_prices_a_step_as_its_terms_say(
    per: dict[str, float], intercept: float, values: list[int]
) -> None:
    """`split` reads its terms once and skips the zeroed ones (a simulated run prices a
    million steps); the seconds must still be, to the bit, the sum its definition says, in
    the file's order."""
    step = StepFeatures(**dict(zip(NAMES, values, strict=True)))
    total = compute = 0.0
    for term, coef in per.items():
        v = coef * term_value(term, step)
        total += v
        if is_compute(term):
            compute += v
    cost = LinearCost(intercept, per)
    assert cost.split(step) == (max(0.0, intercept + total), compute)
    assert cost.split(step) == cost.split(step)  # the second call reads the terms kept


def flat(runs: list[list[Sample]]) -> list[Sample]:
    return [s for run in runs for s in run]


def test_the_probes_take_each_run_to_the_grids_median_state() -> None:
    """A shared VM wanders: each run of a point ran in its own spell, slower in memory
    bandwidth by one factor and in arithmetic by another, and the probes timed around it
    read both (with a little noise of their own). Fitted as measured, the spells land in the
    coefficients; fitted at the median state (`at_reference`, as `--drift probes` does),
    the fit finds the machine's costs again and a point's two passes agree."""
    rng = np.random.default_rng(6)
    reference = (0.025, 0.110)  # the probes' medians over the grid, seconds
    runs = []
    for i in range(40):
        steps = synthetic_steps(rng, 12)
        for slow_memory, slow_compute in (rng.uniform(0.8, 1.4, size=2) for _ in range(2)):
            timed = []
            for f in steps:
                total, compute = TRUE.split(f)
                seconds = (total - compute) * slow_memory + compute * slow_compute
                timed.append((f, seconds * rng.lognormal(0.0, 0.01), 1e-4 * slow_memory, 0.0))
            probes = (
                reference[0] * slow_memory * rng.lognormal(0.0, 0.01),
                reference[1] * slow_compute * rng.lognormal(0.0, 0.01),
            )
            point = calibration_grid.Point(f"g{i}", (), (), 1, holdout=i < 8)
            runs.append(points.PointRun(point, timed, [], 0.0, 0.0, probes=probes))
    held = [f"g{i}" for i in range(8)]
    terms = list(TRUE.per)
    measured = [fitting.at_reference(m) for m in runs]
    first = MeasuredProfile.fit(flat(measured), {}, forward_terms=terms, holdout=held)
    steady = [fitting.at_reference(m, reference, first.forward) for m in runs]
    second = MeasuredProfile.fit(flat(steady), {}, forward_terms=terms, holdout=held)
    # Each step as the reference state runs it: the truth, to the probes' and steps' noise.
    for s in flat(steady)[:50]:
        assert s.forward_s == pytest.approx(TRUE.seconds(s.features), rel=0.06)
    assert second.fit_report["forward_holdout_mape"] < 0.03
    assert second.fit_report["forward_holdout_mape"] < first.fit_report["forward_holdout_mape"] / 3
    spread_measured = fitting.pass_spread(runs, measured)
    spread_steady = fitting.pass_spread(runs, steady)
    assert spread_measured is not None and spread_steady is not None
    assert spread_steady < 0.05 < spread_measured
    # Without probes (a run the machine watch did not probe), a run's steps are kept as measured.
    bare = dataclasses.replace(runs[0], probes=None)
    assert fitting.at_reference(bare, reference, first.forward) == fitting.at_reference(bare)
