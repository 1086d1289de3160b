"""A reproduction's result as cells of the paper's table, each a published number beside the
simulated one, and the assumptions the simulation rests on, each with where it came from.

How far a cell is off depends on its unit, so the rule is fixed here, once, for every
reproduction:

- a percentage (`unit="%"`, stored as percent: 40.0, not 0.4) is off by the difference in
  percentage points, simulated - published: a hit rate of 37% against 40% is -3 points, not
  -7.5%, since the paper's own spread is in points;
- any other unit (req/s, x, requests, tokens) is off by the ratio, simulated / published - 1.

A published range (`published` .. `published_high`: "41-75%") is met anywhere inside it;
outside, the deviation is taken from its nearer end by the same rule. `relative` is the ratio
rule whatever the unit, the one measure that compares cells of different units (the docs'
"every deviation over 15%"). A cell whose number the paper draws but never states reliably
(`published=None`) is reported without a deviation: its `source` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POINTS = "%"  # the unit whose deviation is a difference in points


@dataclass(frozen=True)
class Cell:
    """One number of the paper's table or figure: what it published, what the simulation
    gives. `source` says where in the paper the published number is (a table, a figure's
    text), so a reader can check it."""

    name: str
    published: float | None  # None: the paper gives no reliable value (`source` says why)
    simulated: float | None  # None: the simulation could not give it (said in `note`)
    unit: str
    published_high: float | None = None  # a published range: published .. published_high
    source: str = ""
    note: str = ""

    def _target(self) -> float:
        """The published value the simulated one is held to: the value itself, or the
        nearer end of a published range (the simulated value itself when inside it)."""
        assert self.simulated is not None and self.published is not None
        if self.published_high is None:
            return self.published
        return min(max(self.simulated, self.published), self.published_high)

    @property
    def deviation(self) -> float | None:
        """Points for a percentage, simulated / published - 1 otherwise (module docstring)."""
        if self.simulated is None or self.published is None:
            return None
        target = self._target()
        if self.unit == POINTS:
            return self.simulated - target
        return self.simulated / target - 1 if target else None

    @property
    def deviation_kind(self) -> str:
        return "points" if self.unit == POINTS else "relative"

    @property
    def relative(self) -> float | None:
        """simulated / published - 1 whatever the unit (0 inside a published range)."""
        if self.simulated is None or self.published is None:
            return None
        target = self._target()
        return self.simulated / target - 1 if target else None

    def published_text(self) -> str:
        if self.published is None:
            return "-"
        hi = "" if self.published_high is None else f"-{self.published_high:g}"
        return f"{self.published:g}{hi} {self.unit}".replace(" %", "%")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "published": self.published,
            "published_high": self.published_high,
            "simulated": self.simulated,
            "unit": self.unit,
            "deviation": self.deviation,
            "deviation_kind": self.deviation_kind,
            "relative": self.relative,
            "source": self.source,
            "note": self.note,
        }


@dataclass(frozen=True)
class Assumption:
    """Something the simulation takes as given that the paper did not fix, and why: the
    paper's text, a shared set-up note, a measurement, or nanoserve's own limits."""

    text: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"text": self.text, "source": self.source}
