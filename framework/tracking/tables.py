"""The study tables' format, shared by every comparison table written at the top of a sweep
folder (a study's `NAME.md`, a plain sweep's `sweep.md`), so the two read alike: numbers to
four significant digits, a missing value as `-`, a Markdown pipe table and a CSV of the same
rows. Also the order of a sweep's job folders, which both tables follow.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def cell(v: Any) -> str:
    """One table cell: `-` for a value a run does not define, floats to 4 significant digits."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown_table(rows: Sequence[Mapping[str, Any] | Sequence[Any]], cols: Sequence[str]) -> str:
    """A Markdown pipe table under the headers `cols`, each value through `cell`.

    A row is a mapping read by the column names, or a sequence of values in column order.
    The second serves the tables whose headers are prose ("capacity (req/s)") and whose cells
    are formatted to their own precision beforehand (a string passes `cell` unchanged), so a
    reproduction's report and a sweep's table come out in one format."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in _row_values(r, cols)) + " |" for r in rows]
    return "\n".join(lines)


def _row_values(row: Mapping[str, Any] | Sequence[Any], cols: Sequence[str]) -> list[Any]:
    """A row's values in column order; a sequence of the wrong length is an error, not a
    shifted table."""
    if isinstance(row, Mapping):
        return [row.get(c) for c in cols]
    if isinstance(row, str) or len(row) != len(cols):
        raise ValueError(f"a table row needs {len(cols)} values, one per column: {row!r}")
    return list(row)


def write_csv(rows: Sequence[dict[str, Any]], cols: Sequence[str], path: Path) -> None:
    """Raw values (not rounded): the CSV is for further analysis, the Markdown for reading."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cols), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def job_folders(sweep_dir: Path) -> list[Path]:
    """A sweep's job folders (those with a `.hydra` folder), in job order: 0, 1, ..., 10."""
    return sorted(
        (p for p in Path(sweep_dir).iterdir() if (p / ".hydra").is_dir()),
        key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name),
    )
