"""The engine online: one loop in its own thread owns the engine; HTTP handlers talk to it
through a queue of commands and get their tokens back on their own event loop.

Each turn the loop takes every command waiting (a request arrives, a client went away),
runs one step, and hands each live request the tokens the step released: its
`output_token_ids` beyond what it already sent, so a stream carries exactly what the output
policy let out (deferred output holds a window of steps on the device, and delays the
stream by as much). With nothing to do it sleeps on the queue.

Time: a request arrives when the server received it, on the engine's clock. The real
executor runs on the wall clock. A simulation runs on its virtual clock; with
`executor.pace=wall` the loop waits after each step until the wall clock (since the
server's start) reaches the step's virtual end, and when idle the virtual clock jumps to
the next arrival, so the two timelines coincide and no token is sent before the profile
says it exists. Unpaced, a simulation answers as fast as it runs here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from framework.core.request import RequestSpec
from framework.core.sequence import ABORTED, Sequence, Status
from framework.core.token_logprob import TokenLogprob
from framework.engine.loop import Engine, RunResult


@dataclass
class Event:
    """What the engine thread tells a handler: accepted or rejected (once, first), then
    tokens as they are released, the last event with the request's finish reason."""

    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    index: int = 0  # which of the request's samples (choices) the tokens are of
    # Each token's log-probabilities, where the request asks for them; and with its first
    # event, its prompt's (position 0 None), where it asks for those.
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    accepted: bool = False
    rejected: str | None = None
    error: str | None = None  # the engine loop stopped on a bug


class Stream:
    """One request's way between its handler (on the HTTP event loop) and the engine."""

    def __init__(self, spec: RequestSpec, loop: asyncio.AbstractEventLoop, received: float):
        self.spec = spec
        self.loop = loop
        self.received = received  # seconds since the server started, on the wall clock
        self.rid = -1  # its id on the pipe to an engine process (`server.engine=process`)
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        # The engine's sequences, once submitted (engine thread only): its samples, in
        # index order; and the tokens of each handed to the handler so far.
        self.seqs: list[Sequence] = []
        self.sent: list[int] = []

    def put(self, event: Event) -> None:
        """From the engine thread: the handler's loop gets it in order."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


def deliver(items: list[tuple[Stream, Event]]) -> None:
    """On a handlers' event loop: a step's events, each to its stream, in order."""
    for stream, event in items:
        stream.events.put_nowait(event)


STOP = object()


@dataclass(frozen=True)
class EngineState:
    """The engine's numbers that other threads read (`/metrics`, the admission bound), taken
    together on the loop's thread between steps: the engine's lists and counters change
    while a step runs, so read directly a scrape could mix two moments."""

    running: int = 0
    waiting: int = 0  # in the engine, not yet running
    accepted: int = 0  # taken into the engine (not rejected), so far
    taken: int = 0  # submissions the loop has taken, accepted or refused, so far
    blocks_used: int = 0
    blocks_total: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0
    tokens_kept: int = 0
    aborted: int = 0
    overshoot_tokens: int = 0
    steps: int = 0

    @classmethod
    def of(cls, e: Engine, accepted: int = 0, taken: int = 0) -> EngineState:
        c = e.counters
        return cls(
            running=len(e.running),
            waiting=len(e.waiting) + len(e.pending),
            accepted=accepted,
            taken=taken,
            blocks_used=e.pool.num_used,
            blocks_total=e.pool.num_blocks,
            prefix_query_tokens=c.prefix_query_tokens,
            prefix_hit_tokens=c.prefix_hit_tokens,
            preemptions=c.preemptions,
            prefill_tokens=c.prefill_tokens,
            tokens_kept=c.tokens_kept,
            aborted=c.aborted,
            overshoot_tokens=c.overshoot_tokens,
            steps=len(e.steps),
        )


class EngineLoop:
    """The engine in its own thread. `submit` and `abort` may be called from any thread;
    everything else about the engine happens in the loop's thread."""

    def __init__(
        self,
        engine: Engine,
        eos_token_id: int | None,
        pace: bool = False,
        on_finished: Callable[[Sequence], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.eos_token_id = eos_token_id
        self.pace = pace
        self.on_finished = on_finished
        self.on_failure = on_failure
        self.on_turn = on_turn  # after each turn's state is taken (an engine process sends it)
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.live: dict[Sequence, Stream] = {}
        self._queued = 0  # submitted, not yet counted in `state`
        self._taken = 0  # taken into the engine since `state` was last taken
        self._accepted = 0  # taken in and not rejected (the loop's thread only)
        self._taken_all = 0  # taken, accepted or refused (the loop's thread only)
        self._lock = threading.Lock()  # `_queued` and `state` change together under it
        self.state = EngineState()
        self._last_arrival = 0.0
        self.closing = False
        self._ended = False  # the loop's last turn is over: a request now is refused at once
        self.t0 = time.perf_counter()
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.thread = threading.Thread(target=self.run, name="nanoserve-engine", daemon=True)

    # ---- any thread -------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()
        self.started.wait()

    def alive(self) -> bool:
        """Whether the loop still serves (it has not stopped, on a bug or at the end)."""
        return self.error is None and self.thread.is_alive()

    @property
    def ended(self) -> bool:
        """The loop's last turn is over: a request submitted now is refused at once."""
        return self._ended

    def elapsed(self) -> float:
        """Wall seconds since the engine's clock started (a request's receipt)."""
        return time.perf_counter() - self.t0

    def waiting(self) -> int:
        """Requests not yet running: queued in the engine, or on their way to it."""
        with self._lock:
            return self.state.waiting + self._queued

    def running(self) -> int:
        return self.state.running

    def snapshot(self) -> EngineState:
        """The engine's numbers as of the loop's last turn."""
        return self.state

    def in_flight(self) -> int:
        """Requests submitted and not yet finished: what a graceful stop waits for. For an
        instant one may be counted twice (taken in, not yet out of the queued count), never
        missed."""
        with self._lock:
            return len(self.live) + self._queued

    def submit(self, stream: Stream) -> None:
        with self._lock:
            if self._ended:
                stream.put(Event(rejected="the server is shutting down"))
                return
            self._queued += 1
            self.inbox.put(("submit", stream))

    def abort(self, stream: Stream, reason: str = ABORTED, index: int | None = None) -> None:
        """End the request (`index`: only that sample of it)."""
        self.inbox.put(("abort", stream, reason, index))

    def close(self) -> None:
        """Stop taking requests and abort what is still in flight; the loop then runs the
        engine empty and checks its books. Returns at once (uvicorn's loop calls it)."""
        self.inbox.put(STOP)

    def stop(self, timeout: float | None = None) -> RunResult | None:
        """`close`, and wait for the loop to end: the result (None if the loop failed:
        `error` says why)."""
        self.close()
        self.thread.join(timeout)
        return self.result

    # ---- the loop's thread ----------------------------------------------------------------
    def run(self) -> None:
        """The loop itself, in the calling thread (`start` runs it in a thread of its own;
        an engine process runs it in its main thread)."""
        e = self.engine
        try:
            e.prepare()
            e.clock.start()
            self.t0 = time.perf_counter()
            self._take_state()
            self.started.set()
            while True:
                self._commands(block=not e.has_work)
                self._take_state()
                if self.closing and not e.has_work:
                    break
                if e.has_work:
                    e.advance()
                    if self.pace:
                        self._pace()
                    self._publish()
                    self._take_state()
            self.result = e.finish()
        except BaseException as error:
            self.error = error
            self.started.set()
            for stream in list(self.live.values()):
                stream.put(Event(error=f"the engine stopped: {type(error).__name__}: {error}"))
            self.live.clear()
            if self.on_failure is not None:
                self.on_failure(error)
        finally:
            self._refuse_late()

    def _refuse_late(self) -> None:
        """Requests submitted after the last turn are refused, so that no handler waits
        for an answer that will never come: those already in the inbox, and (`_ended`) any
        submitted from now on."""
        with self._lock:
            self._ended = self.closing = True
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if item is not STOP and item[0] == "submit":
                item[1].put(Event(rejected="the server is shutting down"))

    def _commands(self, block: bool) -> None:
        """Every command waiting; with `block`, sleep until one comes."""
        while True:
            try:
                item = self.inbox.get(timeout=0.25) if block else self.inbox.get_nowait()
            except queue.Empty:
                if block and not self.closing:
                    continue
                return
            block = False
            if item is STOP:
                self._close()
            elif item[0] == "submit":
                self._submit(item[1])
            else:
                self._abort(item[1], item[2], item[3])

    def _arrival(self, stream: Stream) -> float:
        """When the request arrived on the engine's clock: at its receipt, on the wall
        clock or a paced simulation's (which follows it); on an unpaced simulation's own
        clock, when the loop took it. Never before an earlier request's."""
        on_wall = self.engine.clock.name == "wall" or self.pace
        t = stream.received if on_wall else self.engine.now()
        self._last_arrival = max(self._last_arrival, t)
        return self._last_arrival

    def _take_state(self) -> None:
        with self._lock:
            self.state = EngineState.of(self.engine, self._accepted, self._taken_all)
            self._queued -= self._taken
            self._taken = 0
        if self.on_turn is not None:
            self.on_turn()

    def _submit(self, stream: Stream) -> None:
        self._taken_all += 1
        self._taken += 1  # still counted as queued until the state that counts it is taken
        if self.closing:
            stream.put(Event(rejected="the server is shutting down"))
            return
        spec = dataclasses.replace(stream.spec, arrival=self._arrival(stream))
        seqs = self.engine.submit(spec, self.eos_token_id)
        if seqs[0].status is Status.REJECTED:  # its samples alike: one prompt, one length
            stream.put(Event(rejected=seqs[0].reject_reason))
            return
        stream.seqs, stream.sent = seqs, [0] * len(seqs)
        for seq in seqs:
            self.live[seq] = stream
        self._accepted += 1
        stream.put(Event(accepted=True))

    def _abort(self, stream: Stream, reason: str, index: int | None = None) -> None:
        ended = False
        for seq in stream.seqs if index is None else stream.seqs[index : index + 1]:
            if seq not in self.live:
                continue  # finished (or never accepted) before the abort came
            self.engine.abort(seq, reason)
            ended |= seq.status is Status.RELEASED  # now; a running one at the next step
        if ended:
            self._publish()

    def _close(self) -> None:
        """Stop taking requests; whatever is still in flight is aborted."""
        self.closing = True
        for seq in list(self.live):
            self.engine.abort(seq)
        self._publish()

    def _pace(self) -> None:
        """Wait until the wall clock reaches the step's end on the virtual clock; the
        virtual clock stands still meanwhile (under measured host time it would count the
        wait as the engine's)."""
        clock = self.engine.clock
        clock.pause()
        wait = clock.now() - self.elapsed()
        if wait > 0:
            time.sleep(wait)
        clock.resume()

    def _publish(self) -> None:
        """Each live request's released tokens to its handler; the finished ones leave.
        A step's events reach each event loop in one call: one wake-up of the loop a step,
        not one a request (each wakes it through a pipe, and takes the GIL from the engine
        thread on two cores)."""
        done = []
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Stream, Event]]] = {}
        for seq, stream in self.live.items():
            out = seq.output_token_ids
            n = len(out)
            finish = seq.finish_reason
            i = seq.sample_index
            sent = stream.sent[i]
            if finish is None and seq.sampling.beam_width > 1:
                continue  # a beam's tokens change until its search ends
            if n > sent or finish is not None:
                event = Event(out[sent:n], finish, index=i)
                sp = seq.sampling
                if sp.logprobs is not None:
                    event.logprobs = seq.output_logprobs[sent:n]
                if sp.prompt_logprobs is not None and sent == 0:  # one copy: the leader's
                    scored = seq.group.leader if seq.group is not None else seq
                    event.prompt_logprobs = list(scored.prompt_logprobs)
                batches.setdefault(stream.loop, []).append((stream, event))
                stream.sent[i] = n
            if finish is not None:
                done.append(seq)
        for loop, items in batches.items():
            loop.call_soon_threadsafe(deliver, items)
        for seq in done:
            del self.live[seq]
            if self.on_finished is not None:
                self.on_finished(seq)
