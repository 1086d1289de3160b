"""The study tables' format, shared by every comparison table written at the top of a sweep
folder (a study's `NAME.md`, a plain sweep's `sweep.md`), so the two read alike: numbers to
four significant digits, a missing value as `-`, a Markdown pipe table and a CSV of the same
rows. Also the order of a sweep's job folders, which both tables follow.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cell(v: Any) -> str:
    """One table cell: `-` for a value a run does not define, floats to 4 significant digits."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


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
