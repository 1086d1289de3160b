"""Device time: what a GPU spent on a step, from events on its stream, read without waiting.

On CUDA the model call returns once its kernels are queued, so a host clock around it reads
the launch time (Python dispatching the kernels), not what the device did: the device's work
shows up later, as the wait in the next readback. A `DeviceSpan` records a CUDA event on the
current stream before the call and one after each part of it (the forward, then the
sampler); the device stamps each event as its queue reaches it, so the time between two
stamps is the device's time for that part. That includes any gap where the device waited for
the host to queue the next kernel (a launch-bound step: a small model in eager mode), so the
figure is never below the device's busy time and comes near the launch time when the host
is what is slow.

The seconds are read only once the last event is known complete (`query()`), which costs
no wait: the engine reads them when the step's tokens are drained, since the readback's copy
was queued behind these events on the same stream and has been waited for. Reading never
synchronises inside a step; `wait` does, and is for the end of a run only. On a CPU there is
no span (`begin` gives None) and the host's own seconds are the forward's.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any, Protocol

import torch


class Event(Protocol):
    """The part of `torch.cuda.Event` a span uses (a test passes a fake)."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds
    def synchronize(self) -> None: ...


def timing_event() -> Event:
    return torch.cuda.Event(enable_timing=True)


class DeviceSpan:
    """Events on one stream: the first starts the span, each later one ends a part of it
    (`framework.engine.executor.SPAN_PARTS`: the forward, then the sampler). The engine
    reads it through `framework.engine.executor.Span`."""

    __slots__ = ("_make", "_parts", "decode_rows", "events")

    def __init__(self, make: Callable[[], Event] = timing_event, decode_rows: int = 0) -> None:
        self._make = make
        self._parts: tuple[float, ...] | None = None
        # rows of a step of decode rows alone (0: it had a prefill row): the output policies'
        # cost of one more decode row is fitted to those steps' device seconds
        self.decode_rows = decode_rows
        self.events: list[Event] = []
        self.mark()

    @classmethod
    def begin(cls, device: torch.device, decode_rows: int = 0) -> DeviceSpan | None:
        """A span starting now on `device`'s current stream; None on a CPU (nothing to time
        apart from the host)."""
        return cls(decode_rows=decode_rows) if device.type == "cuda" else None

    def mark(self) -> None:
        """An event recorded now on the current stream: the end of one more part."""
        event = self._make()
        event.record()
        self.events.append(event)

    def parts(self) -> tuple[float, ...] | None:
        """Each part's device seconds, oldest first; None while the last mark is not done
        (never waits). Read once, then kept."""
        if self._parts is None and self.events[-1].query():
            self._parts = tuple(a.elapsed_time(b) / 1e3 for a, b in pairwise(self.events))
        return self._parts

    def wait(self) -> tuple[float, ...]:
        """The parts' seconds, after waiting for the last mark: for the end of a run (or a
        calibration point), never inside a step."""
        self.events[-1].synchronize()
        parts = self.parts()
        assert parts is not None, "an event synchronised is complete"
        return parts
