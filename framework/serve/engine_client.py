"""The HTTP side of `server.engine=process`: the engine loop's interface (`EngineLoop`'s,
what the handlers, the metrics and the drain call), over a pipe to the engine process
(`engine_core.py`).

The engine process is spawned, not forked: a fork of a process whose torch has run OpenMP
threads may hang in the child, and a fresh interpreter holds nothing of the HTTP side. It
loads the model itself; this process needs only the tokenizer. One thread here reads the
pipe and hands each turn's events to the handlers' event loops in one call, replays the
engine's hook calls on this process's observers, and feeds the metrics the finished
requests. Times agree across the two: both read the same monotonic clock
(`time.perf_counter`), from the engine loop's origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from framework.core.sequence import ABORTED, Sequence
from framework.engine.loop import RunResult
from framework.serve.engine_core import engine_main
from framework.serve.engine_facts import EngineFacts
from framework.serve.engine_loop import EngineState, Event, Stream, deliver

START_TIMEOUT_S = 600.0  # loading and preparing the engine (kernels built on a first run)
HOOKS = ("on_step_end", "on_request_finished")


def shipped(loaded: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """A model loaded here (a test's, a notebook's), as the engine process rebuilds it: its
    config and weights (a module an engine has patched does not pickle), the tokenizer,
    device and dtype."""
    if loaded is None:
        return None
    model, tokenizer, device, dtype = loaded
    if not hasattr(model, "state_dict"):  # a simulation's model shape: plain data
        return ("shape", model, tokenizer, device, dtype)
    weights = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    return ("weights", model.config, weights, tokenizer, device, dtype)


def wanted_hooks(hooks: Any) -> frozenset[str]:
    """The engine hooks some observer implements: only those cross the pipe."""
    out = set()
    for name in HOOKS:
        caller = getattr(hooks, name, None)
        impls = getattr(caller, "get_hookimpls", None)
        if impls is None or impls():  # a relay that cannot say: forward it
            out.add(name)
    return frozenset(out)


class EngineClient:
    """The engine in a process of its own. `submit`, `abort`, `close` may be called from any
    thread; they only write to the pipe."""

    def __init__(
        self,
        cfg: DictConfig,
        loaded: tuple[Any, ...] | None,
        hooks: Any,
        wanted: frozenset[str] = frozenset(HOOKS),
        on_finished: Callable[[Sequence], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.loaded = loaded
        self.hooks = hooks
        self.on_finished = on_finished
        self.on_failure = on_failure
        ctx = mp.get_context("spawn")
        self.conn, self._child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=engine_main,
            args=(self._child_conn, cfg, shipped(loaded), wanted),
            name="nanoserve-engine",
            daemon=True,
        )
        self.streams: dict[int, Stream] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the pipe's writers, and `_sent` with the streams
        self._sent = 0  # submits written, not yet counted in the engine's state
        self.state = EngineState()
        self._taken = 0  # the submissions the engine's last state had counted
        self.closing = False
        self._ended = False
        self.t0 = time.perf_counter()
        self.result: RunResult | None = None
        self.partial: RunResult | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, name="nanoserve-pipe", daemon=True)

    # ---- start and stop ---------------------------------------------------------------------
    def start(self) -> EngineFacts:
        """Spawn the engine process and wait until it serves: its facts. A setting the engine
        refuses raises here, as it would in one process."""
        self.process.start()
        self._child_conn.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.conn.poll(0.1):
            if not self.process.is_alive():
                break  # died before a word: the read below says so
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the engine process did not start in {START_TIMEOUT_S:g} s")
        try:
            message = self.conn.recv()
        except EOFError as exc:
            self.process.join(5)
            raise RuntimeError(
                f"the engine process exited while starting (exit {self.process.exitcode})"
            ) from exc
        if message[0] == "failed":
            self.process.join(30)
            raise message[1]
        _, facts, self.t0 = message
        self.reader.start()
        return facts

    def close(self) -> None:
        """Stop taking requests; the engine aborts what is in flight, runs empty, checks its
        books and sends the result."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
            self._write(("stop",))

    def stop(self, timeout: float | None = None) -> RunResult | None:
        """`close`, and wait for the result (None if the engine failed: `error` says why)."""
        self.close()
        self.done.wait(timeout)
        self.process.join(timeout)
        return self.result

    def alive(self) -> bool:
        return self.error is None and not self.done.is_set() and self.process.is_alive()

    def partial_result(self) -> RunResult:
        """What the engine had done when it failed (for the run folder of a failed run)."""
        if self.partial is None:
            raise RuntimeError("the engine process ended without sending its results")
        return self.partial

    # ---- what the handlers and the metrics ask ------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def snapshot(self) -> EngineState:
        return self.state

    def running(self) -> int:
        return self.state.running

    def waiting(self) -> int:
        with self._lock:
            return self.state.waiting + self._sent

    def in_flight(self) -> int:
        with self._lock:
            return len(self.streams)

    def submit(self, stream: Stream) -> None:
        with self._lock:
            if self._ended:
                stream.put(Event(rejected="the server is shutting down"))
                return
            rid = next(self._ids)
            stream.rid = rid
            self.streams[rid] = stream
            self._sent += 1
            self._write(("submit", rid, stream.spec, stream.received))

    def abort(self, stream: Stream, reason: str = ABORTED, index: int | None = None) -> None:
        with self._lock:
            if stream.rid >= 0 and not self._ended:
                self._write(("abort", stream.rid, reason, index))

    def _write(self, message: tuple[Any, ...]) -> None:
        """Under `_lock`. A pipe the engine closed is an engine that stopped: the reader says
        so to every stream."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(message)

    # ---- the reader's thread ------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    code = self.process.exitcode
                    self._failed(RuntimeError(f"the engine process exited (exit {code})"))
                    return
                kind = message[0]
                if kind == "turn":
                    self._turn(*message[1:])
                elif kind == "result":
                    self.result = message[1]
                    self._end()
                    return
                elif kind == "failed":
                    self.partial = message[2]
                    self._failed(message[1])
                    return
        finally:
            self.done.set()

    def _turn(
        self,
        events: list[tuple[int, Event]],
        calls: list[tuple[str, Any]],
        finished: list[Sequence],
        state: EngineState | None,
        done: list[int],
        closing: bool,
    ) -> None:
        for name, arg in calls:
            if name == "on_step_end":
                self.hooks.on_step_end(stats=arg)
            else:
                self.hooks.on_request_finished(request=arg)
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Stream, Event]]] = {}
        with self._lock:
            for rid, event in events:
                stream = self.streams.get(rid)
                if stream is not None:
                    batches.setdefault(stream.loop, []).append((stream, event))
                    if event.rejected is not None or event.error is not None:
                        del self.streams[rid]
            for rid in done:
                self.streams.pop(rid, None)
            if state is not None:
                self._sent -= state.taken - self._taken
                self._taken = state.taken
                self.state = state
            self.closing |= closing
        for loop, items in batches.items():
            loop.call_soon_threadsafe(deliver, items)
        if self.on_finished is not None:
            for seq in finished:
                self.on_finished(seq)

    def _end(self, last: Event | None = None) -> None:
        """No more submits; every stream still waiting gets `last` (by default refused: none
        waits after a clean stop, but one may have slipped in as it ended)."""
        with self._lock:
            self._ended = True
            left = list(self.streams.values())
            self.streams.clear()
        for stream in left:
            stream.put(last or Event(rejected="the server is shutting down"))

    def _failed(self, error: BaseException) -> None:
        self.error = error
        self._end(Event(error=f"the engine stopped: {type(error).__name__}: {error}"))
        if self.on_failure is not None:
            self.on_failure(error)
