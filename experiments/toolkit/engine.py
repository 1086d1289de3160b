"""What the runs of one tool share: the model loaded once, engine hooks that cost a measured
step nothing, and torch's thread count put back for a caller in the same process."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from omegaconf import DictConfig


class NullHooks:
    """The engine's hooks, doing nothing: no observer costs a measured step anything."""

    def on_step_end(self, stats: Any) -> None:
        pass

    def on_request_finished(self, request: Any) -> None:
        pass


@dataclasses.dataclass
class Context:
    """What every run shares: the loaded model and the base config."""

    cfg: DictConfig
    overrides: list[str]
    model: Any
    tok: Any
    device: torch.device
    dtype: torch.dtype

    @property
    def pad(self) -> int:
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else 0


@contextlib.contextmanager
def threads_kept() -> Iterator[int]:
    """Torch's thread count on entry (yielded), set back on exit whatever the tool set it to:
    a caller in the same process keeps its setting."""
    threads = torch.get_num_threads()
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)
