"""Requests that hold blocks outside the running rows while something beyond the engine
moves their KV: what an engine needs of whoever keeps them.

One engine never moves KV between engines; a cluster does (prefill/decode disaggregation,
`framework.cluster.replica_handoffs`). The engine still owns the rows and the queues, so it
must know two things: a row whose part here is done though it owes more tokens leaves the
rows with its blocks still held (`leave`), and a request whose KV has landed here joins the
rows when one is free (`next_landing`, `land`). Everything else (where the KV goes, when it
lands, the copy that serves the rest) is the keeper's, which the engine is handed
(`Engine.attach_parking`) and otherwise knows only through this protocol.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from framework.core.sequence import Sequence


class Parking(Protocol):
    """The keeper of an engine's parked requests (`Status.PARKED`)."""

    def __bool__(self) -> bool:
        """Whether any request holds blocks here outside the running rows."""
        ...

    @property
    def leaving(self) -> Collection[Sequence]:
        """Parked after their part here, their blocks held until their KV has gone."""
        ...

    @property
    def joining(self) -> Collection[Sequence]:
        """Parked before their part here: blocks reserved, their KV arriving or landed."""
        ...

    def leave(self, seq: Sequence, at: float, forward_s: float) -> None:
        """`seq` left the running rows at `at`, its part here done and its blocks held;
        `forward_s`: the forward seconds of the step that sampled its last token here."""
        ...

    def next_landing(self) -> float | None:
        """When the earliest landed request's KV arrived; None while none has landed."""
        ...

    def land(self) -> Sequence:
        """The earliest landed request, which leaves the keeper to join the running rows."""
        ...
