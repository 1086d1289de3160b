"""The engine's side of `server.engine=process`: the engine loop in a process of its own, as
vLLM's engine core runs, so that it never waits on the HTTP side's interpreter.

In one process the engine's thread gives Python's GIL up at every torch call of a forward
and waits to get it back whenever the HTTP thread (parsing, detokenizing, streaming) holds
it: on two cores that convoy costs the engine a tenth of its speed or more. Here the engine
loop runs in this process's main thread, unchanged; one more thread only reads the pipe
(it sleeps in a read, and wakes for a request or an abort).

What crosses the pipe, pickled, one message a turn of the loop (the front end is
`engine_client.py`):
- to here: `submit` (an id, the request, when it was received), `abort`, `stop`;
- from here: `ready` (the engine's facts and the loop's clock origin) once, then `turn`
  messages: each stream's events of the turn, the engine's hook calls (observers run in the
  front end), the sequences that finished (for its metrics), the engine's state, and which
  streams are done; at the end `result` (the run's `RunResult`) or `failed`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
from omegaconf import DictConfig

from framework.core.request import RequestSpec
from framework.core.sequence import Sequence
from framework.serve.engine_facts import EngineFacts
from framework.serve.engine_loop import EngineLoop, EngineState, Event, Stream


class Outbox:
    """What the loop tells the front end during a turn, sent as one message at its end. Any
    thread may add; the lock keeps a turn's message whole (the pipe has one writer at a
    time)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.events: list[tuple[int, Event]] = []
        self.calls: list[tuple[str, Any]] = []  # engine hook calls, in order
        self.finished: list[Sequence] = []
        self.done: list[int] = []  # streams the front end may forget
        self.state: EngineState | None = None
        self.sent_state: EngineState | None = None
        self.closing = False

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send(message)

    def flush(self) -> None:
        """The turn's message, if it says anything new."""
        with self.lock:
            if not (self.events or self.calls or self.finished or self.done) and (
                self.state == self.sent_state
            ):
                return
            message = (
                "turn", self.events, self.calls, self.finished, self.state, self.done, self.closing
            )  # fmt: skip
            self.events, self.calls, self.finished, self.done = [], [], [], []
            self.sent_state = self.state
            self.conn.send(message)

    # the engine loop's view of a stream's event loop (`Stream.loop`)
    def call_soon_threadsafe(self, fn: Callable[..., Any], items: list[Any]) -> None:
        with self.lock:
            self.events.extend((s.rid, e) for s, e in items)


class RemoteStream(Stream):
    """A request of the front end, as the engine loop sees it: its events go to the outbox."""

    def __init__(self, rid: int, spec: RequestSpec, received: float, outbox: Outbox) -> None:
        self.spec = spec
        self.received = received
        self.outbox = outbox
        self.loop = outbox  # type: ignore[assignment]
        self.seqs = []
        self.sent = []
        self.rid = rid
        self.over = False  # refused, or the loop failed under it: nothing more will come

    def put(self, event: Event) -> None:
        self.over |= event.rejected is not None or event.error is not None
        with self.outbox.lock:
            self.outbox.events.append((self.rid, event))


class ForwardedHooks:
    """The engine's observer hooks, recorded for the front end, where the observers are
    (an MLflow run's step series, a progress bar). Only the hooks some observer implements
    are recorded: the others cost a step nothing."""

    def __init__(self, outbox: Outbox, wanted: frozenset[str]) -> None:
        self.outbox = outbox
        self.wanted = wanted

    def on_step_end(self, stats: Any) -> None:
        if "on_step_end" in self.wanted:
            self.outbox.calls.append(("on_step_end", stats))

    def on_request_finished(self, request: Any) -> None:
        if "on_request_finished" in self.wanted:
            self.outbox.calls.append(("on_request_finished", request))


def engine_main(
    conn: Connection, cfg: DictConfig, loaded: tuple[Any, ...] | None, wanted: frozenset[str]
) -> None:
    """The engine process: build the engine as `serve.py` would in one process, say it is
    ready, run the loop until told to stop, send the result. Signals are the front end's to
    handle (a Ctrl-C reaches the whole process group): it drains, then says `stop`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    outbox = Outbox(conn)
    try:
        from framework.run.app import build_engine, load

        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        torch.manual_seed(cfg.seed)
        model, tokenizer, device, dtype = unshipped(loaded) if loaded else load(cfg)
        engine = build_engine(cfg, model, device, dtype, ForwardedHooks(outbox, wanted))
        facts = EngineFacts.of(cfg, engine, tokenizer.eos_token_id)
    except BaseException as error:  # a setting the engine refuses: the front end says it
        outbox.send(("failed", picklable(error), None))
        return
    streams: dict[int, RemoteStream] = {}

    def finished(seq: Sequence) -> None:
        outbox.finished.append(seq)

    loop = EngineLoop(
        engine, tokenizer.eos_token_id, cfg.executor.pace == "wall", on_finished=finished
    )
    ready = threading.Event()

    def turn() -> None:
        if not ready.is_set():  # the first turn: the engine is prepared, its clock started
            outbox.send(("ready", facts, loop.t0))
            ready.set()
        outbox.state = loop.state
        outbox.closing = loop.closing
        for rid, stream in list(streams.items()):
            if stream.over or (stream.seqs and not any(s in loop.live for s in stream.seqs)):
                outbox.done.append(rid)
                del streams[rid]
        outbox.flush()

    loop.on_turn = turn
    reader = threading.Thread(
        target=read, args=(conn, loop, streams, outbox), name="nanoserve-engine-pipe", daemon=True
    )
    reader.start()
    loop.run()  # until `stop`, or a failure
    try:
        if loop.error is None or ready.is_set():
            turn()  # the last events: the aborted, the refused
        if loop.error is not None:
            partial = None
            with contextlib.suppress(Exception):  # the books of a half step may not add up
                partial = engine.partial_result()
            outbox.send(("failed", picklable(loop.error), partial))
        else:
            outbox.send(("result", loop.result))
    except (BrokenPipeError, EOFError, OSError):
        pass  # the front end is gone: nobody to tell


def read(
    conn: Connection, loop: EngineLoop, streams: dict[int, RemoteStream], outbox: Outbox
) -> None:
    """The front end's commands, into the loop's inbox; its going away stops the loop."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            loop.close()  # the front end died: abort what is left and stop
            return
        kind = message[0]
        if kind == "submit":
            _, rid, spec, received = message
            stream = RemoteStream(rid, spec, received, outbox)
            streams[rid] = stream
            loop.submit(stream)
            if loop.ended:
                outbox.flush()  # refused after the last turn: no turn will send it
        elif kind == "abort":
            _, rid, reason, index = message
            known = streams.get(rid)
            if known is not None:
                loop.abort(known, reason, index)
        elif kind == "stop":  # what comes after is refused: read on until the pipe closes
            loop.close()


def unshipped(loaded: tuple[Any, ...]) -> tuple[Any, Any, torch.device, torch.dtype]:
    """The front end's loaded model, rebuilt here from its config and weights
    (`engine_client.shipped`)."""
    if loaded[0] == "shape":
        return loaded[1], loaded[2], loaded[3], loaded[4]
    from transformers import AutoModelForCausalLM

    _, config, weights, tokenizer, device, dtype = loaded
    model = AutoModelForCausalLM.from_config(config).to(dtype=dtype)
    model.load_state_dict(weights)
    model = model.to(device=device).eval()
    return model, tokenizer, device, dtype


def picklable(error: BaseException) -> BaseException:
    """`error` itself where it crosses the pipe, else a RuntimeError that names it."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
