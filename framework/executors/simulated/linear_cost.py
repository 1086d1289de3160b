"""The terms a measured profile prices a step with, and the linear cost over them.

A term of `per` is a `StepFeatures` field (seconds per unit), `FIELD>KNOT`, a hinge: the
seconds per unit of FIELD above KNOT, or a derived term (`DERIVED`: a cost no single field
carries, such as the packed layers' padding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from framework.executors.simulated.cost import ProfileError
from framework.executors.simulated.features import NAMES, StepFeatures

# ---- terms ---------------------------------------------------------------------------------
# Terms computed from the features, for costs no single feature carries.
DERIVED: dict[str, Callable[[StepFeatures], float]] = {
    # The packed Linear layers pad a step's rows up to their bucket with one concatenation
    # and one slice per layer: a fixed cost whenever the count is off a bucket.
    "padded": lambda f: float(f.linear_tokens > f.num_tokens),
    "pad_tokens": lambda f: float(f.linear_tokens - f.num_tokens),
    "has_prefill": lambda f: float(f.prefill_rows > 0),
    # What the portable decode path reads: every decode row padded to the longest context
    # (the mean context where the longest is not known).
    "decode_padded_ctx": lambda f: float(max(f.decode_rows * f.decode_max_ctx, f.decode_ctx)),
    "has_decode": lambda f: float(f.decode_rows > 0),
}


# Terms whose seconds go with the machine's arithmetic: the Linear layers' work per token
# (a prompt's, or many decode rows' past the weights' one read), the LM head's per row, and
# attention's query x context products. The rest (the intercept: every weight read once; the
# decode rows' KV reads; fixed costs per step) goes with memory bandwidth and overheads.
# `executor.compute_speed` divides the first kind, `executor.speed` the second.
COMPUTE_FEATURES = frozenset(
    {"num_tokens", "linear_tokens", "prefill_tokens", "prefill_attn", "pad_tokens", "rows"}
)


@functools.lru_cache(maxsize=256)
def is_compute(term: str) -> bool:
    """Whether a term (`linear_tokens>8`, `decode_ctx`, `padded`) is compute bound."""
    return parse_term(term)[0] in COMPUTE_FEATURES


@functools.lru_cache(maxsize=256)  # a profile's few terms, parsed once, not every step
def parse_term(name: str) -> tuple[str, int | None]:
    """`decode_ctx` -> ("decode_ctx", None); `linear_tokens>64` -> ("linear_tokens", 64)."""
    feature, sep, knot = name.partition(">")
    if feature not in NAMES and not (feature in DERIVED and not sep):
        known = ", ".join((*NAMES, *DERIVED))
        raise ValueError(f"{feature!r} is not a step feature (known: {known})")
    if not sep:
        return feature, None
    if not knot.isdigit():
        raise ValueError(f"{name!r}: a hinge is FEATURE>KNOT with a whole number KNOT")
    return feature, int(knot)


def term_value(name: str, features: StepFeatures) -> float:
    feature, knot = parse_term(name)
    if feature in DERIVED:
        return DERIVED[feature](features)
    value = float(getattr(features, feature))
    return value if knot is None else max(0.0, value - knot)


# A term made ready to price a step: (derived function or None, feature, knot, coefficient,
# compute-bound or not).
Priced = tuple[Callable[[StepFeatures], float] | None, str, int | None, float, bool]


@dataclass
class LinearCost:
    """`intercept_s + sum(per[term] * term(features))` seconds, never below zero.

    `per` is read once, on the first step priced, into `_priced` (its terms parsed and the
    zeroed ones dropped): a simulated run prices a million steps three times each, and
    parsing every term every time was a tenth of the engine's work at trace scale. So `per`
    is not to be changed in place once the cost has priced a step; make another cost."""

    intercept_s: float = 0.0
    per: dict[str, float] = field(default_factory=dict)
    _priced: tuple[Priced, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def seconds(self, features: StepFeatures) -> float:
        return self.split(features)[0]

    def _terms(self) -> tuple[Priced, ...]:
        if self._priced is None:
            ready = []
            for t, c in self.per.items():
                if c == 0.0:  # adds exactly nothing: the sums below are unchanged without it
                    continue
                feature, knot = parse_term(t)
                ready.append((DERIVED.get(feature), feature, knot, c, is_compute(t)))
            self._priced = tuple(ready)
        return self._priced

    def split(self, features: StepFeatures) -> tuple[float, float]:
        """(all the seconds, those of the compute-bound terms): see `COMPUTE_FEATURES`.
        Every coefficient is non-negative, so the compute part is never above the whole."""
        total = compute = 0.0
        for derived, feature, knot, c, is_comp in self._terms():
            if derived is not None:
                value = derived(features)
            else:
                value = getattr(features, feature)
                if knot is not None:
                    value = value - knot if value > knot else 0
            v = c * value
            total += v
            if is_comp:
                compute += v
        return max(0.0, self.intercept_s + total), compute

    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept_s": float(self.intercept_s),
            "per": {t: float(c) for t, c in self.per.items()},
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> LinearCost:
        if not isinstance(data, Mapping):
            raise ProfileError(f"{where}: must be a mapping with intercept_s and per")
        intercept = seconds_field(data.get("intercept_s"), f"{where}.intercept_s")
        per = data.get("per", {})
        if not isinstance(per, Mapping):
            raise ProfileError(f"{where}.per: must map step features to seconds per unit")
        coefs: dict[str, float] = {}
        for term, value in per.items():
            try:
                parse_term(str(term))
            except ValueError as exc:
                raise ProfileError(f"{where}.per.{term}: {exc}") from exc
            coefs[str(term)] = seconds_field(value, f"{where}.per.{term}")
        return cls(intercept, coefs)


def seconds_field(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{where}: must be a number of seconds; got {value!r}")
    if not np.isfinite(value) or value < 0:
        raise ProfileError(f"{where}: must be finite and >= 0; got {value!r}")
    return float(value)
