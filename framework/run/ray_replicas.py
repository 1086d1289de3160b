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

import contextlib
import os
import secrets
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.api.router import ClusterView, Router
from framework.cluster.group import ReplicaResults, check_served_once, route
from framework.cluster.outages import Outage, OutageRecord, parse_outages
from framework.core.request import RequestSpec
from framework.core.sample_group import sample_specs
from framework.core.sequence import Sequence, Status
from framework.engine.counters import Counters
from framework.engine.loop import RunResult
from framework.engine.step_log import StepLog
from framework.run.cluster_run import merge
from framework.run.errors import RunStopped
from framework.run.ray_actor import ReplicaActor


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
        faults = cfg.cluster.get("faults")  # checked before Ray starts
        self.faults_set = bool(faults)
        outages = parse_outages(OmegaConf.to_container(faults) if faults else None, replicas)

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
        # Ray's handles proxy each actor method as an object with `.remote`, which its type
        # stubs cannot state: the handles are typed Any.
        self.actor_cls: Any = ray.remote(num_cpus=1)(ReplicaActor)
        self.config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.builders = builders
        self.actors: list[Any] = [
            self.actor_cls.remote(self.config_yaml, *builders) for _ in range(replicas)
        ]
        self.max_num_seqs = int(cfg.engine.max_num_seqs)
        self.replica_of: dict[str, int] = {}
        self.first: dict[str, int] = {}  # `route`'s own book: each request routed once
        self.history: dict[str, list[int]] = {}  # each request's replicas, in order
        self.specs: list[RequestSpec] = []
        self.results: dict[int, RunResult] = {}
        # Replica failures: the live replicas; the kills `cluster.faults` asks for, due in
        # order; what each replica was handed and has not reported finished; the requests
        # collected as finished (with their replica); the outages and their causes.
        self.live = list(range(replicas))
        self.kills: deque[Outage] = deque(outages)
        self.assigned: list[dict[str, RequestSpec]] = [{} for _ in range(replicas)]
        self.done: dict[str, tuple[int, Sequence]] = {}
        self.outages: list[OutageRecord] = []
        self.causes: list[str] = []
        # `cluster.restart_replicas`: the restarts each replica has left, and the replicas
        # whose new actor is starting (its `start` call), to rejoin once it has.
        self.restarts_left = [int(cfg.cluster.get("restart_replicas") or 0)] * replicas
        self.starting: dict[int, Any] = {}
        self.t0 = time.perf_counter()
        self.collected_at = 0.0

    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> RunResult:
        ray = self.ray
        # A request's samples (`sampling.n`) are placed as requests of their own: each
        # collected, lost and placed again alone. They share no blocks, even on one replica.
        specs = [s for spec in specs for s in sample_specs(spec)]
        self.specs = specs
        try:
            ray.get([a.start.remote() for a in self.actors])
            self.t0 = time.perf_counter()
            for spec in sorted(specs, key=lambda s: s.arrival):
                self._wait_until(spec.arrival)
                self._place(spec, spec.arrival)
                self._collect(every_s=0.05)
            self.results = self._finish()
        finally:
            for a in self.actors:
                with contextlib.suppress(Exception):
                    a.close.remote()
            ray.shutdown()
            if self.scratch is not None:
                os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
                self.scratch.cleanup()
        parts = self._parts()
        check_served_once(specs, parts, self.replica_of)
        return self._merged(parts, specs)

    def partial_result(self) -> RunResult:
        """What came back before a stop: each live replica's result if they finished, else
        the requests collected as they finished (every replica's, lost ones' included)."""
        if not self.results and not self.done and not self.outages:
            raise RuntimeError("the Ray replicas returned no result before the run stopped")
        served = [s for s in self.specs if s.id in self.done or s.id in self.replica_of]
        return self._merged(self._parts(), served)

    # ---- replicas lost and their requests placed again --------------------------------
    def _elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _wait_until(self, t: float) -> None:
        """Sleep until `t` (seconds into the replay), killing the replicas `cluster.faults`
        names as their times come: each actor really dies, and is found lost by the next
        call to it, as any other death would be."""
        while True:
            self._rejoin()
            now = self._elapsed()
            if self.kills and self.kills[0].down_at_s <= now:
                with contextlib.suppress(Exception):
                    self.ray.kill(self.actors[self.kills.popleft().replica], no_restart=True)
                continue
            if now >= t:
                return
            due = self.kills[0].down_at_s if self.kills else t
            time.sleep(max(0.0, min(t, due) - now))

    def _ask(self, method: str, *args: Any, view_index: bool = False) -> dict[int, Any]:
        """`method` called on every live replica at once (with its view index first when
        `view_index`): the answers by replica. A replica whose call fails (its actor died,
        or its engine raised) is lost, and the answers are those of the others."""
        refs: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        for j, i in enumerate(self.live):
            try:
                call = getattr(self.actors[i], method)
                refs[i] = call.remote(j, *args) if view_index else call.remote(*args)
            except Exception as exc:
                failed[i] = exc
        answers: dict[int, Any] = {}
        for i, ref in refs.items():
            try:
                answers[i] = self.ray.get(ref)
            except Exception as exc:
                failed[i] = exc
        for i, error in failed.items():
            self._lose(i, error)
        return answers if not failed else {i: a for i, a in answers.items() if i in self.live}

    def _place(self, spec: RequestSpec, now: float, again: bool = False) -> None:
        """Route `spec` among the live replicas (`now`: the router's view time) and hand it
        over; `again`: a lost replica's request, routed once more."""
        while True:
            if not self.live:
                if not self.starting:
                    raise self._all_lost()
                self._rejoin(block=True)
                continue
            live = list(self.live)
            states = self._ask("state", spec, view_index=True)
            if live != self.live:  # one was lost meanwhile: ask those left
                continue
            view = ClusterView(now=now, replicas=tuple(states[i] for i in live))
            book = {} if again else self.first
            j = route(self.router, view, spec, book, self.name, self.provider)
            replica = live[j]
            try:
                self.actors[replica].submit.remote(spec)
            except Exception as exc:  # (an in-process stand-in raises at the call)
                self._lose(replica, exc)
                again = True
                continue
            self.assigned[replica][spec.id] = spec
            self.replica_of[spec.id] = replica
            self.history.setdefault(spec.id, []).append(replica)
            return

    def _lose(self, replica: int, cause: BaseException) -> None:
        """`replica` is lost: its requests not collected as finished are routed again, from
        their prompts (the driver has none of their tokens), to the live replicas."""
        if replica not in self.live:
            return
        self.live.remove(replica)
        with contextlib.suppress(Exception):
            self.ray.kill(self.actors[replica], no_restart=True)
        owed = sorted(
            (s for k, s in self.assigned[replica].items() if k not in self.done),
            key=lambda s: s.arrival,
        )
        self.assigned[replica] = {}
        at = self._elapsed()
        why = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        self.outages.append(OutageRecord(replica, at, None, len(owed), books_kept=False))
        self.causes.append(f"replica {replica} at {at:.2f} s: {why}")
        print(
            f"cluster: replica {replica} lost at {at:.2f} s ({why}); its {len(owed)} "
            "unfinished requests go to the live replicas",
            file=sys.stderr,
        )
        self._restart(replica)
        for spec in owed:
            self._place(spec, at, again=True)

    def _restart(self, replica: int) -> None:
        """A new actor for a lost replica, while it has restarts left
        (`cluster.restart_replicas`): it starts in the background and rejoins the live
        replicas once started (`_rejoin`), with an empty engine."""
        if self.restarts_left[replica] <= 0:
            return
        self.restarts_left[replica] -= 1
        try:
            self.actors[replica] = self.actor_cls.remote(self.config_yaml, *self.builders)
            self.starting[replica] = self.actors[replica].start.remote()
        except Exception as exc:
            self.causes.append(f"replica {replica}'s restart: {exc}")

    def _rejoin(self, block: bool = False) -> None:
        """Restarted replicas whose actor has started join the live ones (`block`: wait
        for the first); one whose start failed is restarted again while it may be."""
        for replica, ref in list(self.starting.items()):
            ready, _ = self.ray.wait([ref], timeout=None if block else 0)
            if not ready:
                continue
            del self.starting[replica]
            try:
                self.ray.get(ref)
            except Exception as exc:
                self.causes.append(f"replica {replica}'s restart: {exc}")
                self._restart(replica)
                continue
            self.live = sorted([*self.live, replica])
            at = self._elapsed()
            open_ = [o for o in self.outages if o.replica == replica and o.up_s is None]
            if open_:
                open_[-1].up_s = at
            print(f"cluster: replica {replica} restarted at {at:.2f} s", file=sys.stderr)
            block = False

    def _all_lost(self) -> RunStopped:
        owed = len(self.specs) - len(self.done)
        return RunStopped(
            f"cluster.backend=ray: every replica was lost ({'; '.join(self.causes)}); "
            f"{len(self.done)} requests finished, {owed} did not (the run folder is marked "
            "incomplete)"
        )

    def _collect(self, every_s: float = 0.0) -> None:
        """The requests each live replica finished since the last call (at most every
        `every_s` seconds): kept here, so a replica lost later owes none of them."""
        if self._elapsed() - self.collected_at < every_s:
            return
        self.collected_at = self._elapsed()
        for replica, seqs in self._ask("collect").items():
            for seq in seqs:
                self.done[seq.id] = (replica, seq)
                self.assigned[replica].pop(seq.id, None)

    def _finish(self) -> dict[int, RunResult]:
        """Every live replica's result once all are idle; a replica lost meanwhile has its
        requests placed again, and the others are waited for again."""
        while True:
            while True:
                self._wait_until(self._elapsed())  # kills that have come due
                self._collect(every_s=0.05)
                idle = self._ask("idle")
                if not self.live:
                    if not self.starting:
                        raise self._all_lost()
                    self._rejoin(block=True)
                    continue
                if len(idle) == len(self.live) and all(idle.values()):
                    break
                time.sleep(0.005)
            live = list(self.live)
            results = self._ask("finish")
            if live == self.live:
                return results

    def _parts(self) -> list[RunResult]:
        """A result per replica: its live actor's own, with the requests an earlier actor
        of it finished before it was lost (a restart); a lost replica's, those alone (its
        steps and counters died with it)."""
        parts = []
        for i in range(len(self.actors)):
            part = self.results.get(i) or RunResult(
                [], StepLog(), Counters(), self.max_num_seqs, 0, 0
            )
            own = {s.id for s in part.seqs}
            earlier = [s for r, s in self.done.values() if r == i and s.id not in own]
            for s in earlier:  # collected when they finished; their release died with them
                if s.status is Status.FINISHED:
                    s.status, s.released_at = Status.RELEASED, s.finished_at
            parts.append(replace(part, seqs=[*part.seqs, *earlier]) if earlier else part)
        return parts

    def _merged(self, parts: list[RunResult], specs: list[RequestSpec]) -> RunResult:
        held = {s.id for r in parts for s in r.seqs}
        placed = {k: v for k, v in self.replica_of.items() if k in held}
        history = {k: list(v) for k, v in self.history.items() if k in held}
        outages = list(self.outages) if self.outages or self.faults_set else None
        return merge(ReplicaResults(parts, placed, replicas_of=history, outages=outages), specs)
