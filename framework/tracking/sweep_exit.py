"""What a sweep must still do if it ends before Hydra's `on_multirun_end`: a failed job, a
refused study or Ctrl-C ends the sweep early, and its table and MLflow parent run must still
be finished (written, printed, closed as FAILED).

Each step is registered with `atexit`, for a process that simply ends, and kept here too, so
that the command line, which catches the error, runs them at once: before its own `error:`
line, and without leaving them to the end of a process that goes on (a test, a notebook).
"""

from __future__ import annotations

import atexit
from collections.abc import Callable

_pending: list[Callable[[], None]] = []


def at_early_end(step: Callable[[], None]) -> None:
    """Run `step` if the sweep ends before `on_multirun_end` (or at exit, at the latest)."""
    _pending.append(step)
    atexit.register(step)


def done(step: Callable[[], None]) -> None:
    """The sweep reached its end: `step` is no longer pending."""
    if step in _pending:
        _pending.remove(step)
    atexit.unregister(step)


def finish_early() -> None:
    """Run every pending step now, newest first (the order `atexit` would use)."""
    while _pending:
        step = _pending.pop()
        atexit.unregister(step)
        step()
