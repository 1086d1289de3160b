"""Held-token output: each step's sampled tokens stay on the device until the output policy
lets them come home, and then reach their requests.

`HeldTokens` owns the held steps and the step's bookkeeping of what arrived: the tokens kept
and the requests they finished, however many drains the step made (the rows may change at
eviction, growth, displacement or admission, and every held token must reach its request
first). The engine reads the step's totals once, with `take`.

On CUDA a step's forward and sampling seconds come from events on the device's stream (the
executor's `ExecResult.span`); they are read when the tokens come home, never waited for in
a step (the drain has already waited for a copy queued after them), and put in the step's
row of the step log in place of the host's launch seconds (`device_phases`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.api.policy import OutputView
from framework.core.sequence import Sequence, Status
from framework.engine.clock import Clock
from framework.engine.costs import MeasuredCosts
from framework.engine.counters import Counters
from framework.engine.executor import SPAN_PARTS
from framework.engine.invariants import InvariantError
from framework.engine.phases import PhaseTimer
from framework.engine.readback import Pending, Readback
from framework.engine.view_factory import make_frozen

if TYPE_CHECKING:
    from framework.engine.executor import ExecResult, Span
    from framework.engine.scores import Scores
    from framework.engine.step_log import StepLog

# What a run's description says when its forward and sampling seconds are the device's
# (CUDA events, read at the drains) and the host's launches of them are its `host` phase.
DEVICE_TIMED = {"forward_time": "device"}


@dataclass
class HeldStep:
    """Sampled tokens of one step still on the device, and the rows that produced them."""

    rows: list[Sequence]
    unkept: list[bool]  # rows whose token nobody keeps (padding, or a chunk that samples none)
    pending: Pending
    window: float  # the output policy's window when these were sampled
    # When these tokens exist on the device, on a virtual clock whose device runs apart
    # from the host (`VirtualClock.overlap`); unread otherwise.
    ready_at: float = 0.0
    # The step's forward seconds: a layer-wise KV transfer of a request handed off from
    # this step overlaps its layers (`framework.cluster.handoffs`).
    forward_s: float = 0.0
    scores: Scores | None = None  # the log-probabilities its rows asked for

    @property
    def kept_rows(self) -> int:
        return len(self.unkept) - sum(self.unkept)


Drained = list[tuple[HeldStep, list[int]]]


class HeldTokens:
    """The held steps, oldest first, and what this step's drains delivered."""

    def __init__(
        self,
        readback: Readback,
        costs: MeasuredCosts,
        clock: Clock,
        counters: Counters,
        timer: PhaseTimer,
        log: StepLog,
    ) -> None:
        self.on_device: list[HeldStep] = []
        self.readback = readback
        self.costs = costs
        self.clock = clock
        self.counters = counters
        self.timer = timer  # a simulator's predicted readbacks and waits are charged to it
        self.readback_s: float | None = None  # `price_readbacks`
        # Requests whose part here is done though they owe more tokens (a prefill replica's,
        # after their first token), each with its step's forward seconds: the engine takes
        # them out of the running rows, their blocks still held, to be handed off.
        self.handed: list[tuple[Sequence, float]] = []
        # The step log each step's row joins, and the device spans not read yet, oldest
        # first: (the step's index in the log, its held step, the span).
        self.log = log
        self.unread: deque[tuple[int, HeldStep, Span]] = deque()
        self.device_timed = False  # a span has been read: the forward seconds are the device's
        self.begin_step()

    def begin_step(self) -> None:
        """A new step: nothing delivered yet."""
        self.kept = 0
        self.finished: list[Sequence] = []

    def take(self) -> tuple[int, list[Sequence]]:
        """This step's tokens kept and requests finished, over all its drains."""
        return self.kept, self.finished

    def price_readbacks(self, seconds: float | None) -> None:
        """A readback's seconds as the executor predicts them, for a simulator that does
        none (None: each is timed as it happens). Said once, when a run starts."""
        self.readback_s = seconds

    def take_handed(self) -> list[tuple[Sequence, float]]:
        """The rows the drains found done here though they owe more tokens, each with its
        step's forward seconds, for the planner to hand off; none are left."""
        handed, self.handed = self.handed, []
        return handed

    def announce(self, seq: Sequence) -> None:
        """`seq` ended this step other than by a token (an abort, a stop string): it is
        announced with the requests the drains finished."""
        self.finished.append(seq)

    def lose_all(self) -> int:
        """Every held step is lost with its device (a replica's failure): never read back,
        its tokens reach no request. Returns the tokens lost."""
        lost = 0
        for held in self.on_device:
            for seq, unkept in zip(held.rows, held.unkept, strict=True):
                if not unkept:
                    seq.num_held -= 1
            lost += held.kept_rows
        self.counters.held_tokens -= lost
        self.on_device.clear()
        return lost

    @property
    def count(self) -> int:
        """Steps whose tokens are still on the device."""
        return len(self.on_device)

    @property
    def newest(self) -> HeldStep | None:
        return self.on_device[-1] if self.on_device else None

    def hold(
        self,
        rows: list[Sequence],
        unkept: list[bool],
        result: ExecResult,
        window: float,
        at: float,
    ) -> None:
        """A step's sampled tokens join the held steps; their copy home starts now."""
        pending = self.readback.start(result.tokens, result.scores)
        held = HeldStep(rows, unkept, pending, window, at, result.forward_s, result.scores)
        self.on_device.append(held)
        if result.span is not None:
            self.unread.append((len(self.log), held, result.span))
        self.counters.deferred_tokens += held.kept_rows
        self.counters.held_tokens += held.kept_rows

    def view(self, step: int, running: list[Sequence]) -> OutputView:
        """What the output policy decides from."""
        return make_frozen(
            OutputView,
            step=step,
            held_steps=len(self.on_device),
            running=tuple(running),
            transfer_s=self.costs.transfer_s,
            row_s=self.costs.row_s,
        )

    def drain_all(self) -> None:
        """Every held token home and given to its request: the rows are about to change."""
        if self.on_device:
            self.apply(self.drain(len(self.on_device)))

    def drain(self, n: int) -> Drained:
        """The `n` oldest held steps home in one concatenation and one transfer: each step
        with its rows' values, for `apply`."""
        if n <= 0 or not self.on_device:
            return []
        out_steps, self.on_device = self.on_device[:n], self.on_device[n:]
        t = time.perf_counter()
        values = self.readback.fetch([h.pending for h in out_steps])
        if self.readback_s is None:
            self.costs.observe_transfer(time.perf_counter() - t)
        else:  # a simulator prices the readback it does not do, on its clock
            waited, copy = self.clock.fetched(out_steps[-1].ready_at, self.readback_s)
            self.costs.observe_transfer(waited + copy)  # what a real drain's timer reads
            self.timer.readback += copy
            self.timer.wait += waited
        self.counters.transfers += 1
        if self.unread:
            self.read_spans()
        rows = sum(len(h.rows) for h in out_steps) if len(out_steps) > 1 else len(out_steps[0].rows)
        if len(values) != rows:
            raise InvariantError(f"readback brought {len(values)} tokens for {rows} rows")
        if len(out_steps) == 1:  # immediate output: every step, one held step
            return [(out_steps[0], values)]
        drained: Drained = []
        i = 0
        for h in out_steps:
            j = i + len(h.rows)
            drained.append((h, values[i:j]))
            i = j
        return drained

    def read_spans(self) -> None:
        """The device seconds of each held step whose span is done, oldest first, in its row
        in place of the host's launch seconds; never waits (`Span.parts`). At a drain the
        drained steps' spans are done: their copies home, queued on the device after them,
        have been waited for."""
        unread, log = self.unread, self.log
        now = len(log)  # the step being timed: not logged yet
        while unread and (parts := unread[0][2].parts()) is not None:
            step, held, span = unread.popleft()
            held.forward_s = parts[0]  # a layer-wise hand-off overlaps the device's layers
            if span.decode_rows:  # the cost of a decode row, from the device's seconds
                self.costs.observe_forward(span.decode_rows, parts[0])
            if step < now:
                log.set_phases(step, device_phases(log[step].phase_s, parts))
            else:
                self.timer.phases.update(device_phases(self.timer.phases, parts))
            self.device_timed = True

    def settle(self) -> dict[str, str]:
        """At a run's end: the device seconds of the steps never drained (a run stopped with
        tokens held, a lost replica's), after one wait for the newest span, which the older
        ones on the same stream precede; and what the run's forward seconds are, for its
        description (`DEVICE_TIMED` where they are the device's, else nothing)."""
        if self.unread:
            self.unread[-1][2].wait()
            self.read_spans()
        return dict(DEVICE_TIMED) if self.device_timed else {}

    def apply(self, drained: Drained) -> None:
        """Tokens reach their requests; stop and length checks; finish times stamped.

        A token for a request whose stop token already arrived is overshoot: computed because
        the window kept the host from seeing the stop in time. One pass a held step, row by
        row (no tuple a row: at trace scale this runs for every row of every step).
        """
        now = self.clock.now()
        kept = 0
        finished = self.finished
        counters = self.counters
        for h, values in drained:
            window = h.window
            counters.held_tokens -= h.kept_rows
            for seq, unkept, token in zip(h.rows, h.unkept, values, strict=True):
                if unkept:
                    continue
                seq.num_held -= 1
                if seq.finish_reason is not None:
                    counters.overshoot_tokens += 1
                    continue
                out = seq.output_token_ids
                out.append(token)
                seq.token_times.append(now)
                if seq.first_token_at is None:
                    seq.first_token_at = now
                kept += 1
                if token in seq.stop_ids:
                    seq.finish_reason = "stop"
                    if window >= 1:
                        counters.expected_overshoot += (window + 1) / 2
                elif len(out) >= seq.output_limit:
                    if seq.hands_off:  # done here, owed elsewhere
                        seq.status = Status.PARKED
                        self.handed.append((seq, h.forward_s))
                        continue
                    seq.finish_reason = "length"
                if seq.finish_reason:
                    seq.status = Status.FINISHED
                    seq.finished_at = now
                    finished.append(seq)
            if h.scores is not None:  # after its tokens: an entry goes where a token went
                h.scores.deliver(h.rows)
        counters.tokens_kept += kept
        self.kept += kept


def device_phases(phases: Mapping[str, float], parts: tuple[float, ...]) -> dict[str, float]:
    """A step's phase seconds once its device span is read: `forward` and `sample` become
    the device's seconds (`SPAN_PARTS`), and the host's seconds they held, the launches, move
    to `host`: the host's own work outside the engine's named phases, so that the host's
    timeline (every phase but the device's two) still adds up to the step's time."""
    device = dict(zip(SPAN_PARTS, parts, strict=False))
    launch = sum(phases.get(p, 0.0) for p in device)
    return {**device, "host": phases.get("host", 0.0) + launch}
