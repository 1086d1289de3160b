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

from dataclasses import dataclass, replace
from pathlib import Path
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
    # Set where the run's set-up is not the paper's (`PaperSetup.held_to`): the paper's value
    # for its own set-up, labelled ("Mistral-7B on one A100 80GB PCIe: 2.6x"); the cell then
    # has no published value for this set-up and no deviation.
    published_for: str = ""
    paper_value: float | None = None  # with `published_for`: the paper's value, as a number
    # A claim the paper states for every set-up it ran ("Sarathi-Serve above both baselines in
    # every case"): it keeps its published value on any of them (`PaperSetup.others`).
    every_setup: bool = False

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
        if self.published_for:
            return f"not published for this set-up (published for {self.published_for})"
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
            "published_for": self.published_for,
        }


@dataclass(frozen=True)
class PaperSetup:
    """What a paper's numbers were measured on, as config keys and the values the paper ran
    (`model.path` a folder, compared resolved; any other key compared as it composes): a
    published number is a cell's target only on that set-up. Asked about another model, GPU
    or parallelism, a reproduction computes its rules for what was asked, and its cells show
    the paper's value as the paper's, beside, not as a target. `others`: the paper's other
    set-ups, where only its claims for every set-up (`Cell.every_setup`) are targets."""

    label: str  # "Mistral-7B on one A100 80GB PCIe"
    keys: dict[str, Any]
    others: tuple[PaperSetup, ...] = ()

    def differences(self, cfg: Any) -> list[str]:
        """The keys where `cfg` (the composed config of a reproduction's runs) is not the
        paper's set-up, each as `key=value (the paper: value)`."""
        from omegaconf import OmegaConf

        out = []
        for key, want in self.keys.items():
            have = OmegaConf.select(cfg, key)
            same = (
                have is not None and Path(str(have)).resolve() == Path(str(want)).resolve()
                if key == "model.path"
                else have == want
            )
            if not same:
                out.append(f"{key}={have} (the paper: {want})")
        return out

    def which(self, cfg: Any) -> PaperSetup | None:
        """The paper's set-up `cfg` is on (this one or one of `others`), or None."""
        return next((s for s in (self, *self.others) if not s.differences(cfg)), None)

    def held_to(self, cells: list[Cell], cfg: Any) -> list[Cell]:
        """`cells` as they stand on `cfg`'s set-up: unchanged on the paper's; on another of the
        paper's set-ups only the claims for every set-up kept; elsewhere each published value
        moved to `published_for`, labelled with the paper's set-up."""
        on = self.which(cfg)
        if on is self:
            return cells
        return [
            c
            if c.published is None or (on is not None and c.every_setup)
            else replace(
                c,
                published=None,
                published_high=None,
                published_for=f"{self.label}: {c.published_text()}",
                paper_value=c.published,
            )
            for c in cells
        ]


@dataclass(frozen=True)
class Assumption:
    """Something the simulation takes as given that the paper did not fix, and why: the
    paper's text, a shared set-up note, a measurement, or nanoserve's own limits."""

    text: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"text": self.text, "source": self.source}
