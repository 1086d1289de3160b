"""Bringing sampled tokens from the device to the host.

On one stream a device-to-host copy waits for everything queued before it, so deferring
removes journeys, not waiting: k held steps come home as one concatenation on the device
and one `.tolist()`. On CUDA each held step also starts its copy at once, on a second stream
into pinned memory with an event, so the copy overlaps the next forward instead of
serialising with it, and a drain only waits for copies that are (usually) already done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from framework.engine.scores import Scores


@dataclass
class Pending:
    # On the device; or a host list from an executor that has no device (the simulator):
    # then there is nothing to transfer, and a drain only joins the lists.
    tokens: torch.Tensor | list[int]
    host: torch.Tensor | None = None  # pinned copy in flight (CUDA)
    done: torch.cuda.Event | None = None


class Readback:
    def __init__(self, device: torch.device) -> None:
        self.overlap = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.overlap else None  # type: ignore[no-untyped-call]

    def start(self, tokens: torch.Tensor | list[int], scores: Scores | None = None) -> Pending:
        """Begin moving one step's tokens home (a no-op where there is no second stream),
        and its log-probabilities where it has them: their tensors are swapped for pinned
        host copies in flight, read (`Scores.home`) once the step's copy is waited for."""
        if not self.overlap or isinstance(tokens, list):
            return Pending(tokens)
        assert self.stream is not None
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()  # after the sampler on the compute stream
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            host.copy_(tokens, non_blocking=True)
            if scores is not None:
                for name in ("logprob", "top_ids", "top_logprobs"):
                    value = getattr(scores, name)
                    copy = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                    copy.copy_(value, non_blocking=True)
                    value.record_stream(self.stream)
                    setattr(scores, name, copy)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        tokens.record_stream(self.stream)
        return Pending(tokens, host, done)

    def fetch(self, pending: list[Pending]) -> list[int]:
        """The held steps' token ids, oldest first: one host transfer."""
        if not pending:
            return []
        if isinstance(pending[0].tokens, list):  # host values already: no device, no copy
            return [t for p in pending for t in p.tokens]
        if self.overlap:
            values: list[int] = []
            for p in pending:
                assert p.done is not None and p.host is not None
                p.done.synchronize()
                values.extend(p.host.tolist())
            return values
        tensors = cast(list[torch.Tensor], [p.tokens for p in pending])  # on the device, all
        flat = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        values = flat.tolist()
        return values
