"""One replica of a Ray cluster (`cluster.backend=ray`): a Ray actor holding a whole engine
over the real executor, stepping in a thread of its own as requests come in.

The driver (`framework.run.ray_replicas`) calls it: `state` for the router, `submit`, then
`collect` now and then (the requests finished since the last call: what the driver keeps if
this replica is lost later), `finish` once the workload is in (when it is idle: its result,
its books checked; asked again if requests come after), and `close`. A replica whose engine
raised answers every later call with that error, so the driver treats it as lost at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from omegaconf import OmegaConf

from framework.api.router import ReplicaState, ReplicaView
from framework.core.request import RequestSpec
from framework.core.sequence import Sequence
from framework.engine.loop import RunResult


class Finished:
    """The engine's hooks here: the observers run in the driver, so the replica only keeps
    the requests it finishes, for `collect`."""

    def __init__(self) -> None:
        self.seqs: list[Sequence] = []

    def on_step_end(self, stats: Any) -> None:
        pass

    def on_request_finished(self, request: Any) -> None:
        self.seqs.append(request)


class ReplicaActor:
    """One replica: an engine built from the run's config, stepping in its own thread."""

    def __init__(self, cfg_yaml: str, load: Callable[..., Any], build_engine: Callable[..., Any]):
        """`load` and `build_engine` are the run's own (`framework.run.app`), handed over by
        reference: this actor builds its engine as a local run does."""
        import torch

        cfg = OmegaConf.create(cfg_yaml)
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        torch.manual_seed(cfg.seed)
        model, tokenizer, device, dtype = load(cfg)
        self.finished = Finished()
        self.engine = build_engine(cfg, model, device, dtype, self.finished)
        self.eos = tokenizer.eos_token_id
        self.inbox: queue.SimpleQueue[RequestSpec] = queue.SimpleQueue()
        # Held by the stepping thread while it takes requests in and steps: a caller that
        # holds it sees the engine between steps.
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self.engine.prepare()
        self.engine.clock.start()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        try:
            while not self.closed.is_set():
                with self.lock:
                    self._take_in()
                    if self.engine.has_work:
                        self.engine.advance()
                        continue
                time.sleep(0.0005)
        except BaseException as exc:  # every later call raises it: the driver sees a loss
            self.error = exc

    def _take_in(self) -> None:
        """Under `lock`: every request handed over, into the engine."""
        while not self.inbox.empty():
            self.engine.submit(self.inbox.get(), self.eos)

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def state(self, index: int, request: RequestSpec) -> ReplicaState:
        """What the router reads, counting every request handed over so far: one the
        stepping thread has not yet taken in (it may not have run since, on a busy machine)
        counts as the engine's, else a router would see this replica emptier than it is."""
        self._check()
        with self.lock:
            self._take_in()
            return ReplicaState.of(ReplicaView(index, self.engine), request)

    def submit(self, spec: RequestSpec) -> None:
        self._check()
        self.inbox.put(spec)

    def collect(self) -> list[Sequence]:
        """The requests finished since the last call."""
        self._check()
        with self.lock:
            out, self.finished.seqs = self.finished.seqs, []
        return out

    def idle(self) -> bool:
        """Whether every request handed to it is served."""
        self._check()
        with self.lock:
            return self.inbox.empty() and not self.engine.has_work

    def finish(self) -> RunResult:
        """Once every request handed to it is served: its result, its books checked."""
        while True:
            self._check()
            with self.lock:
                if self.inbox.empty() and not self.engine.has_work:
                    return self.engine.finish()
            time.sleep(0.001)

    def close(self) -> None:
        self.closed.set()
