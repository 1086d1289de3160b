"""What observers learn about a run: one record from its start to its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from framework.engine.loop import RunResult


@dataclass
class RunInfo:
    """What observers learn about a run (`on_run_start`, `on_run_end`)."""

    config: DictConfig
    output_dir: Path
    num_requests: int | None  # None: served online, requests arrive while it runs
    result: RunResult | None = None
    summary: dict[str, Any] = field(default_factory=dict)  # metrics.json, once written
    texts: dict[str, str] = field(default_factory=dict)
    # Seconds before the engine's clock started (`start_run`), in metrics.json as they are.
    startup: dict[str, float] = field(default_factory=dict)
