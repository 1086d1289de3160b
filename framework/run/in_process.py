"""What code that builds engines inside its own process needs besides the run's path: engine
hooks that report to nobody, and torch's thread count given back to the caller."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class NullHooks:
    """The engine's hooks, doing nothing: no observer costs a measured step anything, and a
    replica whose observers run elsewhere reports to nobody."""

    def on_step_end(self, stats: Any) -> None:
        pass

    def on_request_finished(self, request: Any) -> None:
        pass


@contextlib.contextmanager
def threads_kept() -> Iterator[int]:
    """Torch's thread count on entry (yielded), set back on exit whatever the code inside set
    it to: a caller in the same process keeps its setting."""
    threads = torch.get_num_threads()
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)
