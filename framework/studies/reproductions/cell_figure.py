"""A grid-and-compare reproduction's figure, drawn from its cells alone: one panel per unit,
the simulated value of each cell a bar, the published value a star over it (a hollow star
where the number was published for another set-up than the one asked, so it is the paper's
and no target). A reproduction whose paper draws something else draws its own figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from framework.studies.reproductions.cells import Cell
from framework.tracking.figures import plt, save_figure


def draw_cells(png: Path, cells: Sequence[Cell], title: str) -> None:
    """Every cell in its unit's panel, in the cells' order, labelled by name."""
    units = list(dict.fromkeys(c.unit for c in cells))
    fig, axes = plt.subplots(
        1, len(units), figsize=(4 + 2.2 * max(len(units), 1) * 2, 4.8), squeeze=False
    )
    for ax, unit in zip(axes[0], units, strict=True):
        mine = [c for c in cells if c.unit == unit]
        x = np.arange(len(mine))
        ax.bar(
            x,
            [c.simulated or 0.0 for c in mine],
            color="tab:blue",
            label="nanoserve (simulated)",
        )
        held = [(i, c.published) for i, c in enumerate(mine) if c.published is not None]
        if held:
            ax.plot(*zip(*held, strict=True), "k*", markersize=12, label="published")
        beside = [(i, c.paper_value) for i, c in enumerate(mine) if c.paper_value is not None]
        if beside:
            ax.plot(
                *zip(*beside, strict=True),
                "k*",
                markersize=12,
                markerfacecolor="none",
                label="published for the paper's set-up",
            )
        ax.set_xticks(x, [c.name for c in mine], rotation=25, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, png)
