"""A run folder's files as a reader finds them: a long run's `steps.csv` and `outputs.jsonl`
are gzipped (`steps.csv.gz`, `outputs.jsonl.gz`), and a reader should not care which."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO


def run_file(folder: Path, name: str) -> Path:
    """`folder/name`, or its gzipped form where that is what the run wrote."""
    path = folder / name
    gz = folder / f"{name}.gz"
    return gz if not path.exists() and gz.exists() else path


def open_run_file(path: Path) -> IO[str]:
    """A run file opened for reading text, gunzipped where its name ends in `.gz`."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


def read_text(path: Path) -> str:
    with open_run_file(path) as f:
        return f.read()
