"""Measured profiles: a step's seconds as a non-negative linear fit over its features, fitted
by `experiments.calibrate` to steps timed on the real executor.

A profile file (YAML or JSON) holds, besides `format`, `kind: measured` and `meta`:

    forward:  {intercept_s: 0.021, per: {linear_tokens: 1.9e-4, decode_ctx: 2.1e-7, ...}}
    sample:   {intercept_s: 2.0e-5, per: {rows: 4.0e-6, random_rows: 1.1e-4}}
    readback_s: 3.0e-6      # one device-to-host readback of sampled tokens
    host:     {per_step_s: 4.0e-4, per_row_s: 2.0e-5}
    prepare:  {intercept_s: 1.5e-4, per: {rows: 4.0e-6, num_tokens: 2.0e-7, decode_ctx: 1.0e-8}}
    fit:      {points: ..., holdout_points: ..., forward_holdout_mape: ..., ...}

A term of `per` is priced as `linear_cost` says: a step feature, a hinge `FIELD>KNOT` or a
derived term. Hinges make the fit piecewise linear where the
machine changes regime (a few rows read every weight once and are memory bound; many rows are
compute bound), without a term per regime that would have to be chosen by hand at prediction
time.

Every coefficient is fitted non-negative (Lawson-Hanson NNLS), so no step of any shape, inside
the grid or beyond it, is predicted to cost less than nothing; a negative slope would be
extrapolated into negative seconds by the first batch larger than the grid's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from framework.engine.view_factory import make_frozen
from framework.executors.simulated.cost import FORMAT, HostCost, ProfileError, StepCost
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.linear_cost import (
    LinearCost,
    parse_term,
    seconds_field,
    term_value,
)


# ---- fitting -------------------------------------------------------------------------------
def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson & Hanson's active set method).

    Written out here (30 lines) so that fitting needs numpy alone; scipy is not a dependency.
    Columns should be of comparable scale (the caller normalises them).
    """
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter or 3 * n + 30):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            shrink = passive & (z <= 0)
            gap = x[shrink] - z[shrink]  # >= 0: x >= 0 and z <= 0 there
            alpha = float(np.min(np.where(gap > 0, x[shrink] / np.where(gap > 0, gap, 1), 0.0)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def fit_linear(
    features: Sequence[StepFeatures],
    seconds: Sequence[float],
    terms: Sequence[str],
    *,
    relative: bool = True,
) -> LinearCost:
    """The non-negative intercept and per-term costs that minimise the *relative* squared
    error: each step weighs 1/seconds, so a 2 ms decode step is fitted as closely as a 2 s
    prefill (the simulator's latencies are made of both, and a makespan mostly of the small).
    `relative=False` minimises the plain squared error instead: for host work, whose right
    skew (an allocation, a cache miss) a run adds up too, so the fit must keep the mean."""
    y = np.asarray(seconds, dtype=float)
    if len(y) == 0:
        raise ValueError("no steps to fit")
    cols = [np.ones(len(y))] + [np.array([term_value(t, f) for f in features]) for t in terms]
    x = np.stack(cols, axis=1)
    weight = 1.0 / np.maximum(y, 1e-9) if relative else np.ones_like(y)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0  # a term that is zero on every step: fitted as 0
    coef = nnls(x * weight[:, None] / scale, y * weight) / scale
    return LinearCost(float(coef[0]), {t: float(c) for t, c in zip(terms, coef[1:], strict=True)})


def run_scale(model: LinearCost, samples: Sequence[Sample], attr: str) -> float:
    """The factor that makes the median run's summed seconds come out right: the median,
    over the groups (grid points' runs), of measured over predicted sums.

    A fit on relative error shrinks: with noisy steps, the coefficients that minimise the
    squared *relative* error predict below the mean (by about the noise's variance), and a
    shared VM's noise is skewed slow besides. A simulated run adds its steps up, so that
    bias lands on every makespan and latency: unscaled, the runs' sums come out a few percent
    short at the median (figures: docs/measurements/code-notes.md). Scaling every
    coefficient by one factor keeps the fit's shape
    (how a 2 ms step compares with a 2 s one) and removes the bias from the sums."""
    sums: dict[str, list[float]] = {}
    for s in samples:
        acc = sums.setdefault(s.group, [0.0, 0.0])
        acc[0] += getattr(s, attr)
        acc[1] += model.seconds(s.features)
    ratios = [real / pred for real, pred in sums.values() if pred > 0 and real > 0]
    return float(np.median(ratios)) if ratios else 1.0


def scaled(model: LinearCost, factor: float) -> LinearCost:
    """Every coefficient times `factor`: the same shape, another level."""
    return LinearCost(model.intercept_s * factor, {t: c * factor for t, c in model.per.items()})


def fit_host(rows: Sequence[int], host_s: Sequence[float]) -> HostCost:
    """Per-step and per-row host seconds: the NNLS line through the mean host time at each
    row count, each weighted by its number of steps.

    The mean, not the median: a simulated run adds these up, and the host time's right
    skew (an allocation, a cache miss) is part of what a real run adds up too (measured on
    SmolLM2: the median line came out 11% short over the held-out runs, the mean 2.5%). A
    step over 10x its row count's median (a garbage collection, a neighbour's burst) is
    dropped first: one such step would move a mean of a few dozen by more than the skew.
    """
    by: dict[int, list[float]] = {}
    for n, s in zip(rows, host_s, strict=True):
        by.setdefault(int(n), []).append(float(s))
    if not by:
        return HostCost()
    counts = sorted(by)
    kept = {k: [s for s in by[k] if s <= 10 * float(np.median(by[k]))] for k in counts}
    r = np.array(counts, dtype=float)
    mean = np.array([np.mean(kept[k]) for k in counts])
    w = np.sqrt([len(kept[k]) for k in counts])
    a = np.stack([np.ones_like(r), r], axis=1)
    scale = np.abs(a).max(axis=0)
    coef = nnls(a * w[:, None] / scale, mean * w) / scale
    return HostCost(per_step_s=float(coef[0]), per_row_s=float(coef[1]))


@dataclass(frozen=True)
class Sample:
    """One timed step: its features, its seconds, and the grid point (config) it came from,
    so that holdout is by configuration and never by steps of a run the fit has seen."""

    features: StepFeatures
    forward_s: float
    sample_s: float
    group: str
    # The real executor's host work turning the batch into tensors (`ExecResult.prepare_s`):
    # a simulated step builds none, so under `executor.host_time=measured` it is predicted.
    prepare_s: float = 0.0


def errors(model: LinearCost, samples: Sequence[Sample], attr: str) -> dict[str, float]:
    """Per step: the mean, 90th percentile and max of |relative error|; per group (a whole
    run's seconds summed, what a makespan sees): the mean and max of |relative error|, and
    the median signed error (the bias a simulated run's sums carry)."""
    if not samples:
        return {}
    pred = np.array([model.seconds(s.features) for s in samples])
    real = np.array([getattr(s, attr) for s in samples])
    rel = np.abs(pred - real) / np.maximum(real, 1e-9)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group, []).append(i)
    signed = np.array([pred[ix].sum() / max(real[ix].sum(), 1e-9) - 1 for ix in groups.values()])
    run = np.abs(signed)
    return {
        "mape": float(rel.mean()),
        "p90": float(np.quantile(rel, 0.9)),
        "max": float(rel.max()),
        "run_mape": float(run.mean()),
        "run_max": float(run.max()),
        # the median run's signed error: below 0, the profile predicts runs too fast
        "run_bias": float(np.median(signed)),
    }


# ---- the profile ---------------------------------------------------------------------------
@dataclass
class MeasuredProfile:
    """A `CostModel` fitted to measured steps of one model x machine x dtype."""

    meta: dict[str, Any]
    forward: LinearCost
    sample: LinearCost
    readback_s: float = 0.0
    host: HostCost = field(default_factory=HostCost)
    fit_report: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    kind: str = "measured"
    # The real executor's tensor preparation per step (its ids, positions, slot mapping and
    # block tables): host work the simulated executor does not do, added to a simulated
    # step under `executor.host_time=measured` (under `model`, `host` covers it). Zero in
    # profiles calibrated before it was measured.
    prepare: LinearCost = field(default_factory=LinearCost)

    def predict(self, features: StepFeatures) -> StepCost:
        forward, compute = self.forward.split(features)
        sample = self.sample.seconds(features)
        return make_frozen(StepCost, forward_s=forward, sample_s=sample, compute_s=compute)

    @classmethod
    def fit(
        cls,
        samples: Sequence[Sample],
        meta: dict[str, Any],
        *,
        forward_terms: Sequence[str],
        sample_terms: Sequence[str] = ("rows", "random_rows"),
        holdout: Iterable[str] = (),
        readback_s: float = 0.0,
        host: HostCost | None = None,
        prepare_terms: Sequence[str] = (),
    ) -> MeasuredProfile:
        """Fitted on the samples whose group is not in `holdout`; the report gives the error
        on those held out (and, for comparison, on the fitted ones)."""
        held = set(holdout)
        train = [s for s in samples if s.group not in held]
        test = [s for s in samples if s.group in held]
        for terms in (forward_terms, sample_terms, prepare_terms):
            for t in terms:
                parse_term(t)  # a typo fails here, not after minutes of measuring
        feats = [s.features for s in train]
        forward = fit_linear(feats, [s.forward_s for s in train], forward_terms)
        sample = fit_linear(feats, [s.sample_s for s in train], sample_terms)
        # The relative fit's shape, scaled so that the fitted runs' sums are right at the
        # median (`run_scale`): the simulator adds steps up.
        forward_scale = run_scale(forward, train, "forward_s")
        sample_scale = run_scale(sample, train, "sample_s")
        forward, sample = scaled(forward, forward_scale), scaled(sample, sample_scale)
        prepare = (
            fit_linear(feats, [s.prepare_s for s in train], prepare_terms, relative=False)
            if prepare_terms
            else LinearCost()
        )
        report: dict[str, Any] = {
            "points": len(train),
            "holdout_points": len(test),
            "groups": len({s.group for s in train}),
            "holdout_groups": len({s.group for s in test}),
            "forward_scale": round(forward_scale, 5),
            "sample_scale": round(sample_scale, 5),
        }
        for name, model, attr in (
            ("forward", forward, "forward_s"),
            ("sample", sample, "sample_s"),
        ):
            for split, part in (("train", train), ("holdout", test)):
                for k, v in errors(model, part, attr).items():
                    report[f"{name}_{split}_{k}"] = round(v, 5)
        if prepare_terms and test:
            # A run adds these seconds up: the total over the held-out steps is the error
            # that reaches a simulated clock (a step's own host time is noisy).
            real = sum(s.prepare_s for s in test)
            pred = sum(prepare.seconds(s.features) for s in test)
            report["prepare_holdout_total_error"] = round(pred / max(real, 1e-12) - 1, 5)
        return cls(
            dict(meta), forward, sample, readback_s, host or HostCost(), report, prepare=prepare
        )

    # ---- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": "measured",
            "meta": {k: v for k, v in self.meta.items() if k != "source"},
            "forward": self.forward.to_dict(),
            "sample": self.sample.to_dict(),
            "readback_s": float(self.readback_s),
            "host": {
                "per_step_s": float(self.host.per_step_s),
                "per_row_s": float(self.host.per_row_s),
            },
            "prepare": self.prepare.to_dict(),
            "fit": self.fit_report,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> MeasuredProfile:
        """A profile from a file's contents; a missing or malformed field is a ProfileError
        that names it (`executor.profile=PATH: forward.per.rows: ...`)."""
        where = f"executor.profile={source}: " if source else ""
        try:
            if data.get("format") != FORMAT:
                raise ProfileError(f"format: must be {FORMAT}; got {data.get('format')!r}")
            if data.get("kind") != "measured":
                raise ProfileError(f"kind: must be measured; got {data.get('kind')!r}")
            meta = data.get("meta", {})
            if not isinstance(meta, Mapping):
                raise ProfileError("meta: must be a mapping")
            for key in ("forward", "sample"):
                if key not in data:
                    raise ProfileError(f"{key}: missing")
            host = data.get("host", {})
            if not isinstance(host, Mapping):
                raise ProfileError("host: must be a mapping with per_step_s and per_row_s")
            fit = data.get("fit", {})
            return cls(
                # `meta.source`: the file, so that every result can name what predicted it.
                meta={**meta, "source": source} if source else dict(meta),
                forward=LinearCost.from_dict(data["forward"], "forward"),
                sample=LinearCost.from_dict(data["sample"], "sample"),
                readback_s=seconds_field(data.get("readback_s", 0.0), "readback_s"),
                host=HostCost(
                    seconds_field(host.get("per_step_s", 0.0), "host.per_step_s"),
                    seconds_field(host.get("per_row_s", 0.0), "host.per_row_s"),
                ),
                fit_report=dict(fit) if isinstance(fit, Mapping) else {},
                source=source,
                prepare=LinearCost.from_dict(data.get("prepare", {"intercept_s": 0.0}), "prepare"),
            )
        except ProfileError as err:
            raise ProfileError(where + err.message, err.details) from None

    def write(self, path: Any) -> None:
        """YAML (or JSON for a `.json` path), the coefficients at full precision."""
        import json
        from pathlib import Path

        import yaml

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        if p.suffix == ".json":
            p.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        else:
            # Flow style for the innermost lists and maps (ISA flags, coefficients, the report).
            text = yaml.safe_dump(data, sort_keys=False, width=100, default_flow_style=None)
            p.write_text(text, encoding="utf-8")
