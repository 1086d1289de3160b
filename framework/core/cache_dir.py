"""Where nanoserve keeps what it prepares once per machine and reuses (the dequantised
SmolLM2, an empty migrated MLflow store): `NANOSERVE_CACHE`, else `~/.cache/nanoserve`. One
function, so that every part finds the same folder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | None = None) -> Path:
    """`cache_dir` when given (the run's `model.cache_dir`), else the environment's, else the
    user's cache."""
    root = cache_dir or os.environ.get("NANOSERVE_CACHE") or "~/.cache/nanoserve"
    return Path(root).expanduser()
