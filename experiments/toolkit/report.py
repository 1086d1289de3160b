"""Number formats for the tools' tables, each with one meaning: a percentile of values, a
fraction shown as a percentage, a number to four significant digits."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np


def percentile(values: list[float], q: float) -> float | None:
    """The `q`-th percentile of `values` (0-100); None for no values."""
    return float(np.percentile(values, q)) if values else None


def percent(v: float | None, signed: bool = True) -> str:
    """A fraction as a percentage to one decimal (`+4.2%`, or `4.2%` unsigned); `-` for None."""
    if v is None:
        return "-"
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"


def num(v: float | None) -> str:
    """A number to four significant digits; `-` for None."""
    return "-" if v is None else f"{v:.4g}"


def write_rounded_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """`rows` under `columns`, floats to 6 significant digits (seconds to the microsecond,
    ratios well past the noise)."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(
            {k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows
        )
