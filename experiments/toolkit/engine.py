"""What the runs of one tool share: the model loaded once and the base config."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from omegaconf import DictConfig


@dataclasses.dataclass
class Context:
    """What every run shares: the loaded model and the base config."""

    cfg: DictConfig
    overrides: list[str]
    model: Any
    tok: Any
    device: torch.device
    dtype: torch.dtype
    # The benchmark's HTTP servers of this pass (`experiments.bench.http_peers.HttpPeers`),
    # where it runs any: they outlive one workload, so they travel with the context.
    http: Any = None

    @property
    def pad(self) -> int:
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
