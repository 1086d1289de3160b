"""A cluster: N whole engines behind one router, as one discrete-event replay.

Each replica is an `Engine` with its own KV pool, policies and virtual clock, all clocks on
one time axis from 0. The loop takes the earliest event:
- the next arrival, when no replica with work has a clock before it: the router reads each
  replica as it stands (as of its last step begun before the arrival) and the request joins
  the chosen replica's queue at its arrival time;
- else one step of the replica whose clock is earliest (an idle replica jumps to its next
  arrival first, as a single engine does).

Under `executor.host_time=measured` a replica's clock counts only the real time of its own
steps: it is paused while the others step and while the router decides.

So every step of every replica happens in time order with the arrivals, and nothing sleeps:
a whole trace replays in the time its steps take to price. Every request is routed exactly
once, checked as it is routed and again at the end (`check_served_once`).
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api.guard import Guarded
from framework.api.policy import PolicyError
from framework.api.router import ClusterView, ReplicaView, Router
from framework.engine.loop import Engine, RunResult
from framework.engine.request import RequestSpec


@dataclass
class ClusterResult:
    """Each replica's own result, and which replica served each request (by id)."""

    replicas: list[RunResult]
    replica_of: dict[str, int]


class Cluster:
    def __init__(
        self, engines: list[Engine], router: Router, name: str, provider: str | None = None
    ) -> None:
        if not engines:
            raise ValueError("cluster.replicas must be >= 1")
        self.engines = engines
        self.router = Guarded(router, "router", name, provider)
        self.name = name
        self.provider = provider
        self.views = tuple(ReplicaView(i, e) for i, e in enumerate(engines))
        self.replica_of: dict[str, int] = {}

    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> ClusterResult:
        ids = [s.id for s in specs]
        if len(set(ids)) != len(ids):
            raise ValueError("workload request ids must be unique")
        arrivals = sorted(specs, key=lambda s: s.arrival)
        for e in self.engines:
            e.prepare()
            e.clock.start()
            e.clock.pause()  # each replica's clock counts only its own host work
        # Each replica's next step time, kept as it changes (when it steps, or a request is
        # routed to it): inf while it has no work. A whole trace is millions of iterations.
        inf = float("inf")
        upcoming = [self._next_time(e) if e.has_work else inf for e in self.engines]
        order = range(len(self.engines))
        i = 0
        while True:
            first = min(order, key=upcoming.__getitem__)  # ties: the lowest replica
            if i < len(arrivals) and arrivals[i].arrival <= upcoming[first]:
                chosen = self._route(arrivals[i], eos_token_id)
                upcoming[chosen] = self._next_time(self.engines[chosen])
                i += 1
            elif upcoming[first] == inf:
                break
            else:
                e = self.engines[first]
                e.clock.resume()
                e.advance()
                e.clock.pause()
                upcoming[first] = self._next_time(e) if e.has_work else inf
        return self.finish(specs)

    @staticmethod
    def _next_time(engine: Engine) -> float:
        """When the replica's next step begins: now, or its next arrival when idle."""
        if engine.waiting or engine.running:
            return engine.now()
        return max(engine.now(), engine.pending[0].arrival)

    def _route(self, spec: RequestSpec, eos_token_id: int | None) -> int:
        view = ClusterView(now=spec.arrival, replicas=self.views)
        chosen = route(self.router, view, spec, self.replica_of, self.name, self.provider)
        self.engines[chosen].submit(spec, eos_token_id)
        return chosen

    def partial_result(self) -> ClusterResult:
        return ClusterResult([e.partial_result() for e in self.engines], dict(self.replica_of))

    def finish(self, specs: list[RequestSpec]) -> ClusterResult:
        results = [e.finish() for e in self.engines]
        check_served_once(specs, results, self.replica_of)
        return ClusterResult(results, dict(self.replica_of))


def route(
    router: Router | Guarded,
    view: ClusterView,
    spec: RequestSpec,
    replica_of: dict[str, int],
    name: str,
    provider: str | None,
) -> int:
    """The router's choice for `spec`, checked (an index in range, each request once) and
    recorded in `replica_of`; a choice that breaks the contract is a `PolicyError` naming
    the router."""

    def fail(msg: str) -> PolicyError:
        tag = f" ({provider})" if provider else ""
        return PolicyError(f"router policy {name!r}{tag}: {msg}")

    chosen = router.route(view, spec)
    if isinstance(chosen, bool) or not isinstance(chosen, int):
        raise fail(f"returned {chosen!r} for {spec.id}, not a replica index")
    if not 0 <= chosen < len(view):
        last = len(view) - 1
        raise fail(f"sent {spec.id} to replica {chosen}; the cluster has replicas 0..{last}")
    if spec.id in replica_of:
        raise fail(f"{spec.id} was routed twice")
    replica_of[spec.id] = chosen
    return chosen


def check_served_once(
    specs: list[RequestSpec], results: list[RunResult], replica_of: dict[str, int]
) -> None:
    """Every request of the workload is held by exactly one replica, the one it was routed
    to, and no replica holds a request that was not routed to it."""
    seen: dict[str, int] = {}
    for index, result in enumerate(results):
        for seq in result.seqs:
            if seq.id in seen:
                raise AssertionError(f"{seq.id} is held by replicas {seen[seq.id]} and {index}")
            seen[seq.id] = index
    want = {s.id for s in specs}
    if set(seen) != want:
        lost = sorted(want - set(seen))[:5]
        extra = sorted(set(seen) - want)[:5]
        raise AssertionError(f"requests lost {lost} or unknown {extra} across the replicas")
    wrong = [k for k, v in seen.items() if replica_of.get(k) != v]
    if wrong:
        raise AssertionError(f"{wrong[:5]} are held by another replica than they were routed to")
