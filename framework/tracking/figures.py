"""What every picture of a run shares: matplotlib drawing to files only, a per-step curve
thinned to what a picture can show (`envelope`), a CSV cell as a number, and saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display needed, and no GUI toolkit imported
import matplotlib.pyplot as plt

# Points a per-step curve keeps at most (`envelope`): a few per pixel column of the picture.
CURVE_POINTS = 2000

# steps.csv's columns, one array each (counts as int64, seconds and the window as float64).
StepColumns = dict[str, np.ndarray]

__all__ = ["CURVE_POINTS", "StepColumns", "envelope", "num", "plt", "save_figure"]


def envelope(values: np.ndarray, buckets: int = CURVE_POINTS) -> np.ndarray:
    """The indices of `values` worth drawing: in each of `buckets` runs of consecutive
    points, the first, the last, the lowest and the highest (M4 aggregation: Jugel et al.,
    VLDB 2014). At a bucket per pixel column or narrower the curve drawn through them covers
    the same pixels as the whole series; a million-step run draws in a second, not five."""
    n = len(values)
    if n <= 4 * buckets:
        return np.arange(n)
    width = -(-n // buckets)  # ceil: every point in one bucket
    padded = np.concatenate([values, np.full(width * buckets - n, values[-1])])
    grid = padded.reshape(buckets, width)
    base = np.arange(buckets) * width
    picks = np.concatenate(
        [base, base + grid.argmin(axis=1), base + grid.argmax(axis=1), base + width - 1]
    )
    return np.unique(np.minimum(picks, n - 1))


def num(text: str | None) -> float | None:
    """A CSV cell as a float; None for an empty cell (a time that never happened)."""
    return float(text) if text not in (None, "", "None") else None


def save_figure(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
