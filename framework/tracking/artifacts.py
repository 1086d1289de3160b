"""Which of a run folder's files go to MLflow as artifacts, under `mlflow.max_artifact_mb`.

A trace-scale run leaves hundreds of MB of steps and outputs; copied into the artifact store
for every run of a sweep they would fill its disk. The smallest files go first (the summary,
the config, the plots, the per-request table: what the UI shows), then larger ones while
they fit; the rest stay in the run folder, and the run's tags name them and the folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

MB = 2**20


def size_of(path: Path) -> int:
    """A file's bytes, or a folder's files' together."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def pick_artifacts(
    paths: Sequence[Path], max_mb: float | None
) -> tuple[list[Path], list[tuple[Path, int]]]:
    """(the paths to upload, in their given order; those left out, with their bytes)."""
    if max_mb is None:
        return list(paths), []
    sizes = {p: size_of(p) for p in paths}
    budget = max_mb * MB
    kept: set[Path] = set()
    for p in sorted(paths, key=lambda p: (sizes[p], str(p))):
        if sizes[p] <= budget:
            kept.add(p)
            budget -= sizes[p]
    left = [(p, sizes[p]) for p in paths if p not in kept]
    return [p for p in paths if p in kept], left


def left_out_text(left: Sequence[tuple[Path, int]], folder: Path | None) -> str:
    """`steps.csv.gz (212 MB), outputs.jsonl.gz (380 MB) in FOLDER`: the run's tag."""
    names = ", ".join(f"{p.name} ({n / MB:.0f} MB)" for p, n in left)
    return f"{names} in {folder.resolve()}" if folder is not None else names
