"""Real replicas on Ray (`cluster.backend=ray`): each replica is a Ray actor holding one whole
engine over the real executor; the router runs here, in the driver.

The driver replays the workload on the wall clock: at each request's arrival it asks every
replica for its state (`ReplicaState`: the same figures a simulated cluster's router reads,
the cached prefix of this request included), routes, and hands the request to the chosen
actor. Each actor steps its engine in a thread of its own as requests come in; at the end
each returns its `RunResult`, and the driver checks that every request was served once and
merges them as a local cluster's (`framework.run.cluster_run.merge`), so the run folder and
the MLflow run have the same shape.

Times are each replica's own wall clock from the moment the driver starts the replay (a
call's latency from the driver included). Observers run in the driver: they see the run
start and end, not each replica's steps. Every node needs nanoserve installed, and the model
where `model.path` says.

`cluster.ray_address`: null starts a Ray instance in this process's machine for the run;
`auto` or `HOST:PORT` joins a running cluster (`ray start --head`).
"""

from __future__ import annotations

import os
import queue
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.api.router import ClusterView, ReplicaState, ReplicaView, Router
from framework.engine.cluster import ClusterResult, check_served_once, route
from framework.engine.loop import RunResult
from framework.engine.request import RequestSpec
from framework.run.cluster_run import merge
from framework.run.in_process import NullHooks


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
        # The observers run in the driver: this replica's engine reports to nobody.
        self.engine = build_engine(cfg, model, device, dtype, NullHooks())
        self.eos = tokenizer.eos_token_id
        self.inbox: queue.SimpleQueue[RequestSpec] = queue.SimpleQueue()
        self.closed = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self.engine.prepare()
        self.engine.clock.start()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        try:
            while True:
                while not self.inbox.empty():
                    self.engine.submit(self.inbox.get(), self.eos)
                if self.engine.has_work:
                    self.engine.advance()
                elif self.closed.is_set() and self.inbox.empty():
                    return
                else:
                    time.sleep(0.0005)
        except BaseException as exc:  # handed to the driver by `finish`
            self.error = exc
        finally:
            self.done.set()

    def state(self, index: int, request: RequestSpec) -> ReplicaState:
        return ReplicaState.of(ReplicaView(index, self.engine), request)

    def submit(self, spec: RequestSpec) -> None:
        self.inbox.put(spec)

    def finish(self) -> RunResult:
        """Once every request handed to it is served: its result, its books checked."""
        self.closed.set()
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.engine.finish()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"cluster.ray_address must be null, auto or HOST:PORT; got {address!r}")
    return host, int(port)


def loopback(address: str) -> bool:
    if address == "auto":
        return False
    host, _ = _host_port(address)
    return host == "localhost" or host.startswith("127.")


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """A Ray head that cannot be reached is the user's to fix: one line, at once (Ray's own
    client would retry for minutes)."""
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(
            f"cluster.ray_address={address}: no Ray cluster answers there ({exc})"
        ) from None


class RayRunner:
    """Runs like an engine (`run`, `partial_result`), over replicas that are Ray actors."""

    def __init__(
        self,
        cfg: DictConfig,
        replicas: int,
        routing: tuple[Router, str, str],
        builders: tuple[Callable[..., Any], Callable[..., Any]],
    ) -> None:
        """`routing`: the router, its name and provider; `builders`: the run's `load` and
        `build_engine`, which each actor calls."""
        import ray

        router, name, provider = routing

        address = cfg.cluster.ray_address
        options: dict[str, Any] = {}
        if address is None or loopback(str(address)):  # this machine only: stay on loopback
            options["_node_ip_address"] = "127.0.0.1"
        if address not in (None, "auto"):
            reachable(str(address))
        self.scratch = None
        if address is None and "RAY_AUTH_TOKEN_PATH" not in os.environ:
            # Ray writes a token for the instance it starts, by default to ~/.ray, where every
            # later Ray client of this user would pick it up: this run's stays with this run.
            self.scratch = tempfile.TemporaryDirectory(prefix="nanoserve-ray-")
            token = Path(self.scratch.name) / "auth_token"
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
        try:
            ray.init(
                address=None if address is None else str(address),
                include_dashboard=False,
                log_to_driver=False,
                ignore_reinit_error=True,
                **options,
            )
        except (ConnectionError, RuntimeError) as exc:
            raise ValueError(
                f"cluster.ray_address={address}: no Ray cluster answers there "
                f"({str(exc).splitlines()[0]})"
            ) from None
        self.ray = ray
        self.router, self.name, self.provider = router, name, provider
        actor = ray.remote(num_cpus=1)(ReplicaActor)
        config = OmegaConf.to_yaml(cfg, resolve=True)
        self.actors = [actor.remote(config, *builders) for _ in range(replicas)]
        self.replica_of: dict[str, int] = {}
        self.specs: list[RequestSpec] = []
        self.results: list[RunResult] = []

    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> RunResult:
        ray = self.ray
        self.specs = specs
        try:
            ray.get([a.start.remote() for a in self.actors])
            t0 = time.perf_counter()
            for spec in sorted(specs, key=lambda s: s.arrival):
                wait = spec.arrival - (time.perf_counter() - t0)
                if wait > 0:
                    time.sleep(wait)
                states = ray.get([a.state.remote(i, spec) for i, a in enumerate(self.actors)])
                view = ClusterView(now=spec.arrival, replicas=tuple(states))
                chosen = route(self.router, view, spec, self.replica_of, self.name, self.provider)
                self.actors[chosen].submit.remote(spec)
            self.results = ray.get([a.finish.remote() for a in self.actors])
        finally:
            ray.shutdown()
            if self.scratch is not None:
                os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
                self.scratch.cleanup()
        check_served_once(specs, self.results, self.replica_of)
        return merge(ClusterResult(self.results, dict(self.replica_of)), specs)

    def partial_result(self) -> RunResult:
        """What came back before a stop: nothing, if the replicas never finished."""
        if not self.results:
            raise RuntimeError("the Ray replicas returned no result before the run stopped")
        return merge(ClusterResult(self.results, dict(self.replica_of)), self.specs)
