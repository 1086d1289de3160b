"""One served run: load and build as `run.py` does, serve HTTP until SIGINT / SIGTERM (or
`server.stop_after_*`), then write the run folder and tell the observers (the MLflow run
among them) exactly as a batch run does.

The stop is graceful (`Drain`): the server keeps listening but answers every new request
503 (and /health 503, so a load balancer turns away) while in-flight requests go on, for up
to `server.shutdown_timeout_s`; then those still running are aborted (finish reason
`abort`), uvicorn exits, the engine runs empty and its books are checked (`Engine.finish`).
A second signal stops at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from framework.plugin_host.faults import guard_hooks
from framework.plugin_host.registry import registry
from framework.run.app import build_engine, build_policies, load, resolve_device, start_run
from framework.run.config_checks import check_run, check_window
from framework.run.errors import user_input
from framework.run.report import decode_outputs, mark_complete, write_results
from framework.run.run_info import RunInfo
from framework.run.server_config import check_server
from framework.run.stopped import HasPartialResult, abort
from framework.run.summary import summarize
from framework.serve.app import ServerState, create_app
from framework.serve.engine_client import EngineClient, wanted_hooks
from framework.serve.engine_facts import EngineFacts
from framework.serve.engine_handle import EngineHandle
from framework.serve.engine_loop import EngineLoop
from framework.serve.metrics import ServerMetrics
from framework.serve.prompts import Prompts


def check_before_loading(cfg: DictConfig) -> None:
    """What `run.py` checks before loading, less the workload (requests come over HTTP),
    and what a server cannot do."""
    from framework.executors.model_loader import resolve_dtype

    check_run(cfg)
    check_server(cfg.server)
    build_policies(cfg)
    check_window(cfg)
    resolve_device(cfg.device)
    resolve_dtype(cfg.dtype)
    if int(cfg.cluster.replicas) != 1:
        raise ValueError(
            f"cluster.replicas={cfg.cluster.replicas}: serve.py serves one engine (1 only)"
        )
    if cfg.executor.get("replay"):
        raise ValueError(
            "executor.replay replays a run's requests by id; a server's requests are new: "
            "leave it null under serve.py"
        )


# Seconds uvicorn gives the handlers once the engine has aborted what was left: enough to
# send each its last chunk (the abort comes within one step), a bound on a client that
# stopped reading.
TAIL_S = 5


def model_name(cfg: DictConfig) -> str:
    if cfg.server.model_name:
        return str(cfg.server.model_name)
    if cfg.model.source == "hf":
        return Path(str(cfg.model.path)).name
    return str(cfg.model.source)


@dataclass
class Running:
    """A server once it accepts: its port, its engine loop, and how to stop it (as a first
    SIGINT does: a drain). What `serve_http` hands `on_ready`: a test drives a server in
    its own process."""

    port: int
    loop: EngineHandle
    stop: Callable[[], None]


def serve_http(
    cfg: DictConfig,
    output_dir: Path,
    hooks: Any,
    loaded: tuple[Any, ...] | None = None,
    on_ready: Callable[[Running], None] | None = None,
) -> RunInfo:
    """The served run, from the config to the written run folder (`serve`'s signature, so
    `run_with_observers` runs it with the observers attached)."""
    import uvicorn  # the `serve` extra

    began = time.perf_counter()
    holder: dict[str, Any] = {}

    def halt(*_: Any) -> None:
        """The engine loop failed: nothing is left to drain."""
        server = holder.get("server")
        if server is not None:
            server.should_exit = True

    with user_input():
        check_before_loading(cfg)
        raw_hooks, hooks = hooks, guard_hooks(hooks, registry())
        sock = bind(str(cfg.server.host), int(cfg.server.port))
    try:
        with user_input():
            side = start_engine(cfg, loaded, raw_hooks, hooks, halt)
    except BaseException:
        sock.close()
        raise
    loop, tokenizer, facts = side.loop, side.tokenizer, side.facts

    name = model_name(cfg)
    info = RunInfo(config=cfg, output_dir=output_dir, num_requests=None)
    said = facts.said
    drain = Drain(loop, float(cfg.server.shutdown_timeout_s))
    metrics = ServerMetrics(loop, name, {k: str(v) for k, v in said.items()})
    loop.on_finished = metrics.finished
    done = Counted(cfg.server.stop_after_requests, drain.ask)
    state = ServerState(
        loop=loop,
        prompts=Prompts(tokenizer, facts, int(cfg.seed)),
        tokenizer=tokenizer,
        model_name=name,
        max_waiting=cfg.server.max_waiting,
        metrics=metrics,
        describe=said,
        max_model_len=facts.max_model_len,
        api_key=cfg.server.api_key or os.environ.get("NANOSERVE_API_KEY") or None,
        max_body_bytes=cfg.server.max_body_bytes,
        openapi=bool(cfg.server.get("openapi", True)),
        on_request_done=done.tick,
        draining=lambda: drain.draining,
    )
    config = uvicorn.Config(
        create_app(state),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=TAIL_S,
    )
    ready = None
    if on_ready is not None:
        running = Running(sock.getsockname()[1], loop, drain.ask)
        ready = lambda: on_ready(running)  # noqa: E731
    server = QuietServer(config, banner(sock, name, said), drain, ready)
    holder["server"] = server
    timer = None
    if cfg.server.stop_after_s is not None:
        timer = threading.Timer(float(cfg.server.stop_after_s), drain.ask)
        timer.daemon = True
    switch = sys.getswitchinterval()  # the process's own, back once the server is done
    sys.setswitchinterval(float(cfg.server.switch_interval_ms) / 1000)
    try:
        start_run(info, hooks, began)
        if side.thread is not None:
            side.thread.start()
        if timer is not None:
            timer.start()
        server.run(sockets=[sock])
        result = loop.stop()
        if loop.error is not None:
            raise loop.error
        if result is None:
            raise RuntimeError("the engine loop did not stop")
        info.result = result
        info.texts = decode_outputs(tokenizer, result)
    except BaseException as error:
        if loop.alive():
            loop.stop(timeout=30)
        abort(info, side.owner, tokenizer, hooks, error)
        raise
    finally:
        sys.setswitchinterval(switch)
        if timer is not None:
            timer.cancel()
        sock.close()
    info.summary = mark_complete(summarize(result) | info.startup)
    write_results(output_dir, cfg, result, info.summary, info.texts)
    hooks.on_run_end(run=info, summary=info.summary)
    return info


@dataclass
class EngineSide:
    """The engine as the server holds it: the loop's handle, what the handlers need, and
    what a failed run's partial results come from."""

    loop: EngineHandle
    tokenizer: Any
    facts: EngineFacts
    owner: HasPartialResult
    thread: EngineLoop | None = None  # the loop, where it runs in a thread of this process


def start_engine(
    cfg: DictConfig,
    loaded: tuple[Any, ...] | None,
    raw_hooks: Any,
    hooks: Any,
    on_failure: Callable[[BaseException], None],
) -> EngineSide:
    """`server.engine=process`: spawn the engine process (it loads the model; here only
    the tokenizer) and wait until it serves. `thread`: load and build here, for a thread
    of this process (started with the HTTP server)."""
    if str(cfg.server.engine) == "process":
        tokenizer = loaded[1] if loaded else load(cfg, weights=False)[1]
        client = EngineClient(cfg, loaded, hooks, wanted_hooks(raw_hooks), on_failure=on_failure)
        return EngineSide(client, tokenizer, client.start(), client)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(cfg.seed)
    model, tokenizer, device, dtype = loaded or load(cfg)
    engine = build_engine(cfg, model, device, dtype, hooks)
    facts = EngineFacts.of(cfg, engine, tokenizer.eos_token_id)
    pace = cfg.executor.pace == "wall"
    loop = EngineLoop(engine, tokenizer.eos_token_id, pace, on_failure=on_failure)
    return EngineSide(loop, tokenizer, facts, engine, loop)


class Drain:
    """The graceful stop. Asked once (SIGINT, SIGTERM, `server.stop_after_*`), the server
    drains: it keeps listening and answers each new request 503, so that clients and load
    balancers go elsewhere rather than meet a refused connection, while the requests in
    flight go on. Once none is left, or `timeout_s` has passed, or a second signal comes,
    the engine loop aborts what remains and uvicorn exits. Asking only sets numbers (a
    signal handler asks); uvicorn's loop looks at them every tick (`over`)."""

    def __init__(self, loop: EngineHandle, timeout_s: float) -> None:
        self.loop = loop
        self.timeout_s = timeout_s
        self.asked_at: float | None = None  # monotonic seconds
        self.signals = 0
        self.told = False

    @property
    def draining(self) -> bool:
        return self.asked_at is not None

    def ask(self, *_: Any) -> None:
        """Drain (from any thread); asking again changes nothing."""
        if self.asked_at is None:
            self.asked_at = time.monotonic()

    def on_signal(self, *_: Any) -> None:
        """SIGINT / SIGTERM: the first drains, the next stops at once."""
        self.signals += 1
        self.ask()

    def over(self) -> bool:
        """Whether uvicorn exits now (on its loop, every tick); if so the engine loop has
        been told to abort what is still in flight."""
        if self.asked_at is None:
            return False
        left = self.loop.in_flight()
        waited = time.monotonic() - self.asked_at
        if left and self.signals < 2 and waited < self.timeout_s:
            if not self.told:
                self.told = True
                print(
                    f"nanoserve: stopping: new requests are answered 503 while the {left} in "
                    f"flight finish, for {self.timeout_s:g} s at most (a second Ctrl-C stops now)",
                    flush=True,
                )
            return False
        self.loop.close()
        return True


class Counted:
    """Calls `then` once `limit` requests are done (None: never)."""

    def __init__(self, limit: int | None, then: Any) -> None:
        self.limit, self.then, self.n = limit, then, 0

    def tick(self) -> None:
        self.n += 1
        if self.limit is not None and self.n == self.limit:
            self.then()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that port 0 has its number before the banner."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(
            f"server.host={host} server.port={port}: cannot listen there ({exc})"
        ) from exc
    sock.set_inheritable(True)
    return sock


def banner(sock: socket.socket, name: str, said: dict[str, Any]) -> str:
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    extra = f" · {said['cost_model']} profile {said['profile']}" if "cost_model" in said else ""
    return f"nanoserve: serving {name} on http://{host}:{port}{extra} (Ctrl-C stops)"


class QuietServer:
    """uvicorn's server, started on our socket, printing one line once it accepts. SIGINT
    and SIGTERM go to `drain`, which decides each tick when to exit; the server then
    returns, so the run folder is written (uvicorn's own handlers would exit at once, and
    raise the signal again once stopped)."""

    def __init__(
        self, config: Any, line: str, drain: Drain, ready: Callable[[], None] | None = None
    ) -> None:
        import uvicorn

        line_to_print = line

        class _Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                print(line_to_print, flush=True)
                if ready is not None:
                    ready()

            async def on_tick(self, counter: int) -> bool:
                return await super().on_tick(counter) or drain.over()

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                sigs = (signal.SIGINT, signal.SIGTERM)
                before = {s: signal.signal(s, drain.on_signal) for s in sigs}
                try:
                    yield
                finally:
                    for s, handler in before.items():
                        signal.signal(s, handler)

        self.server = _Server(config)

    @property
    def should_exit(self) -> bool:
        return bool(self.server.should_exit)

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self.server.should_exit = value

    def run(self, sockets: list[socket.socket]) -> None:
        self.server.run(sockets=sockets)
        sys.stdout.flush()
