"""A cluster: N whole engines behind one router, as one discrete-event replay.

Each replica is an `Engine` with its own KV pool, policies and virtual clock, all clocks on
one time axis from 0. The loop takes the earliest event:
- an event of the link between the replicas (prefill/decode disaggregation only: a KV
  transfer's bytes starting or ending, or a transfer done, `framework.cluster.handoffs`);
- the next arrival, when no replica with work has a clock before it: the router reads each
  replica it may choose as it stands (as of its last step begun before the arrival) and the
  request joins the chosen replica's queue at its arrival time;
- else one step of the replica whose clock is earliest (an idle replica jumps to its next
  arrival first, as a single engine does).

Replicas have roles (`mixed` unless `roles` says otherwise): a `mixed` replica serves a
request whole, a `prefill` replica up to its first token, a `decode` replica the rest of
one handed off by a prefill replica. The router chooses among the prefill-capable ones
(`prefill` and `mixed`), on a view of those alone, numbered 0..k-1 in replica order; with
every replica `mixed` that is every replica, and the replay is the plain cluster's.

Under `executor.host_time=measured` a replica's clock counts only the real time of its own
steps: it is paused while the others step and while the router decides.

Replica failures (`cluster.faults`, `framework.cluster.outages`) are events of the same axis
(`framework.cluster.failover`): a replica that fails loses what it held
(`framework.cluster.replica_loss`); the unfinished requests go back to the router, which
places them on the live replicas (a request arriving while none is live waits for the
first to come back); routers see only the live replicas; a replica back starts empty.

So every step of every replica happens in time order with the arrivals, and nothing sleeps:
a whole trace replays in the time its steps take to price. Every request is routed exactly
once (and again only after a failure took it), checked as it is routed and again at the end
(`check_served_once`).
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.api.policy import PolicyError
from framework.api.router import ClusterView, ReplicaView, Router, snapshot
from framework.cluster.failover import FaultSchedule
from framework.cluster.handoffs import Disaggregation
from framework.cluster.link import TransferRecord
from framework.cluster.outages import Outage, OutageRecord
from framework.cluster.replica_loss import lose_replica
from framework.core.request import RequestSpec
from framework.core.sample_group import sample_specs
from framework.core.sequence import Sequence, Status
from framework.engine.loop import Engine, RunResult
from framework.plugin_host.guard import Guarded


@dataclass
class ReplicaResults:
    """Each replica's own result, and which replica served each request (by id): the one
    the router chose (for a request handed off, its prefill replica). With disaggregation,
    also each replica's role, the decode replica of each request handed off, and every
    transfer; None without. Each request's replicas in the order it was placed on them
    (more than one after a failure), and the outages as they happened."""

    replicas: list[RunResult]
    replica_of: dict[str, int]
    roles: list[str] | None = None
    decode_of: dict[str, int] | None = None
    transfers: list[TransferRecord] | None = None
    replicas_of: dict[str, list[int]] | None = None
    outages: list[OutageRecord] | None = None


class Cluster:
    def __init__(
        self,
        engines: list[Engine],
        router: Router,
        name: str,
        provider: str | None = None,
        roles: list[str] | None = None,
        handoffs: Disaggregation | None = None,
        outages: list[Outage] | None = None,
    ) -> None:
        if not engines:
            raise ValueError("cluster.replicas must be >= 1")
        self.engines = engines
        self.router = Guarded(router, "router", name, provider)
        self.name = name
        self.provider = provider
        self.roles = roles
        role = roles or ["mixed"] * len(engines)
        if len(role) != len(engines):
            raise ValueError(f"cluster.roles has {len(role)} roles for {len(engines)} replicas")
        self.prefill_ids = [i for i, r in enumerate(role) if r in ("prefill", "mixed")]
        if not self.prefill_ids:
            raise ValueError("cluster.roles leave no prefill-capable replica (prefill or mixed)")
        if "prefill" in role and handoffs is None:
            raise ValueError("a cluster with prefill replicas needs its hand-offs (a link)")
        for i, r in enumerate(role):
            if r == "prefill":
                engines[i].tokens_here = 1  # its first token, then the request is handed off
        self.handoffs = handoffs if "prefill" in role else None
        if outages and roles is not None:
            raise ValueError("cluster.faults apply to replicas of one role (no cluster.roles)")
        self.faults = FaultSchedule(outages, engines) if outages else None
        self.capable = list(self.prefill_ids)
        self.views = tuple(ReplicaView(j, engines[i]) for j, i in enumerate(self.prefill_ids))
        self.replica_of: dict[str, int] = {}
        self.replicas_of: dict[str, list[int]] = {}
        # Replicas idle with requests waiting that their blocks, held for KV transfers, keep
        # out: they step again at their next arrival, when a transfer frees their blocks, or
        # when a request's KV lands.
        self.stalled: set[int] = set()

    def run(self, specs: list[RequestSpec], eos_token_id: int | None) -> ReplicaResults:
        ids = [s.id for s in specs]
        if len(set(ids)) != len(ids):
            raise ValueError("workload request ids must be unique")
        arrivals = sorted(specs, key=lambda s: s.arrival)
        self._eos = eos_token_id
        for e in self.engines:
            e.prepare()
            e.clock.start()
            e.clock.pause()  # each replica's clock counts only its own host work
        # Each replica's next step time, kept as it changes (when it steps, or a request is
        # routed to it): inf while it has no work. A whole trace is millions of iterations.
        inf = float("inf")
        upcoming = [self._next_time(i) for i in range(len(self.engines))]
        order = range(len(self.engines))
        moves, faults = self.handoffs, self.faults
        i = 0
        while True:
            first = min(order, key=upcoming.__getitem__)  # ties: the lowest replica
            soonest = upcoming[first]
            if i < len(arrivals):
                soonest = min(soonest, arrivals[i].arrival)
            f = faults.next_time() if faults is not None else inf
            if f <= soonest and f < inf and (soonest < inf or faults.orphans):  # type: ignore[union-attr]
                for index in self._fault(f):
                    upcoming[index] = self._next_time(index)
                continue
            t = moves.next_time() if moves is not None else inf
            if moves is not None and t <= soonest and t < inf:
                for src, dst in moves.advance(t):
                    self._wake(src, t)  # its blocks are freed
                    upcoming[src] = self._next_time(src)
                    upcoming[dst] = self._next_time(dst)  # the request's KV has landed
            elif i < len(arrivals) and arrivals[i].arrival <= upcoming[first]:
                chosen = self._route(arrivals[i], eos_token_id)
                if chosen is not None:
                    upcoming[chosen] = self._next_time(chosen)
                i += 1
            elif upcoming[first] == inf:
                if moves is not None and moves.unreserved:
                    raise moves.stuck()
                break
            else:
                e = self.engines[first]
                if first in self.stalled:  # its clock gets to the time it was woken for
                    e.clock.wait_until(upcoming[first])
                    self.stalled.discard(first)
                e.clock.resume()
                stats = e.advance()
                e.clock.pause()
                if stats is None and e.parking and e.waiting and not e.running:
                    self.stalled.add(first)
                upcoming[first] = self._next_time(first)
                if moves is not None:
                    moves.collect(first)
                    if moves.unreserved:
                        for dst in moves.place(e.now()):
                            upcoming[dst] = self._next_time(dst)
        return self.finish(specs)

    def _fault(self, at: float) -> list[int]:
        """The next failure or return, at `at`: the replicas whose next step time changed."""
        faults = self.faults
        assert faults is not None
        event = faults.pop()
        r, engine = event.replica, self.engines[event.replica]
        engine.clock.wait_until(at)
        if event.down:
            copies = lose_replica(engine)
            faults.went_down(r, at, len(copies))
            held: list[RequestSpec | Sequence] = list(copies)
        else:
            held = faults.came_up(r, at)
        self._live()
        touched = {r}
        for item in held:
            placed = self._place(item, at)
            if placed is not None:
                touched.add(placed)
        return sorted(touched)

    def _live(self) -> None:
        """Routers see the live replicas alone, numbered 0..k-1 in replica order."""
        down = self.faults.down if self.faults is not None else set()
        self.prefill_ids = [i for i in self.capable if i not in down]
        self.views = tuple(ReplicaView(j, self.engines[i]) for j, i in enumerate(self.prefill_ids))

    def _place(self, item: RequestSpec | Sequence, at: float) -> int | None:
        """A request held for want of a live replica, or a failed replica's copy of one,
        routed now (`at`); held again while no replica is live."""
        if isinstance(item, RequestSpec):
            return self._route(item, self._eos, at)
        if not self.views:
            self.faults.orphans.append(item)  # type: ignore[union-attr]
            return None
        view = snapshot(at, self.views, item.spec)
        chosen = route(self.router, view, item.spec, {}, self.name, self.provider)
        replica = self.prefill_ids[chosen]
        engine = self.engines[replica]
        engine.clock.wait_until(at)  # an idle replica's clock gets to now; a busy one is there
        engine.take_over(item)
        self.replica_of[item.id] = replica
        self.replicas_of[item.id].append(replica)
        return replica

    def _next_time(self, index: int) -> float:
        """When the replica's next step begins: now, or its next arrival (or KV landing)
        when idle or stalled; inf when it has nothing to do."""
        engine = self.engines[index]
        if engine.running or (engine.waiting and index not in self.stalled):
            return engine.now()
        landing = engine.parking is not None and engine.parking.next_landing() is not None
        if engine.pending or landing:
            return max(engine.now(), engine.next_work())
        return float("inf")

    def _wake(self, index: int, t: float) -> None:
        """A stalled replica whose blocks a transfer freed at `t` tries its queue again."""
        if index in self.stalled:
            self.stalled.discard(index)
            self.engines[index].clock.wait_until(t)

    def _route(
        self, spec: RequestSpec, eos_token_id: int | None, at: float | None = None
    ) -> int | None:
        """`spec` routed at its arrival, or at `at` when it waited for a live replica."""
        if not self.views:  # every replica is down: it waits for the first back
            self.faults.orphans.append(spec)  # type: ignore[union-attr]
            return None
        view = snapshot(spec.arrival if at is None else at, self.views, spec)
        scope = (
            "the cluster has replicas"
            if len(self.views) == len(self.engines)
            else "its view has the prefill-capable replicas (prefill, mixed)"
        )
        chosen = route(self.router, view, spec, self.replica_of, self.name, self.provider, scope)
        replica = self.prefill_ids[chosen]
        self.replica_of[spec.id] = replica
        self.replicas_of[spec.id] = [replica]
        for seq in self.engines[replica].submit(spec, eos_token_id):  # its samples, all here
            self.replica_of[seq.id] = replica
            self.replicas_of[seq.id] = [replica]
        return replica

    def partial_result(self) -> ReplicaResults:
        return self._result([e.partial_result() for e in self.engines])

    def finish(self, specs: list[RequestSpec]) -> ReplicaResults:
        results = [e.finish() for e in self.engines]
        decode_of = self.handoffs.decode_of if self.handoffs is not None else None
        check_served_once(specs, results, self.replica_of, decode_of, self.replicas_of)
        if self.handoffs is not None:
            self.handoffs.check_end(sum(s.sampling.sequences for s in specs))
        return self._result(results)

    def _result(self, results: list[RunResult]) -> ReplicaResults:
        moves = self.handoffs
        return ReplicaResults(
            results,
            dict(self.replica_of),
            roles=list(self.roles) if self.roles is not None else None,
            decode_of=dict(moves.decode_of) if moves is not None else None,
            transfers=list(moves.records) if moves is not None else None,
            replicas_of={k: list(v) for k, v in self.replicas_of.items()},
            outages=list(self.faults.records) if self.faults is not None else None,
        )


def route(
    router: Router | Guarded,
    view: ClusterView,
    spec: RequestSpec,
    replica_of: dict[str, int],
    name: str,
    provider: str | None,
    scope: str = "the cluster has replicas",
) -> int:
    """The router's choice for `spec`, checked (an index in range, each request once) and
    recorded in `replica_of`; a choice that breaks the contract is a `PolicyError` naming
    the router. `scope` says what the view's indices are, for the message."""

    def fail(msg: str) -> PolicyError:
        tag = f" ({provider})" if provider else ""
        return PolicyError(f"router policy {name!r}{tag}: {msg}")

    chosen = router.route(view, spec)
    if isinstance(chosen, bool) or not isinstance(chosen, int):
        raise fail(f"returned {chosen!r} for {spec.id}, not a replica index")
    if not 0 <= chosen < len(view):
        last = len(view) - 1
        raise fail(f"sent {spec.id} to replica {chosen}; {scope} 0..{last}")
    if spec.id in replica_of:
        raise fail(f"{spec.id} was routed twice")
    replica_of[spec.id] = chosen
    return chosen


def check_served_once(
    specs: list[RequestSpec],
    results: list[RunResult],
    replica_of: dict[str, int],
    decode_of: dict[str, int] | None = None,
    replicas_of: dict[str, list[int]] | None = None,
) -> None:
    """Every request of the workload is held by exactly one replica, the one it was routed
    to, and no replica holds a request that was not routed to it. A request handed off is
    held, beside, by its decode replica alone, as a copy that arrived with its first
    tokens (`carried`): prefilled once, decoded once. A request a failure took from a
    replica is held there as lost, once for each time it was placed there before its last
    placement (`replicas_of`), and served by the last alone."""
    seen: dict[str, int] = {}
    copies: dict[str, int] = {}
    lost: dict[str, list[int]] = {}
    for index, result in enumerate(results):
        for seq in result.seqs:
            if seq.status is Status.MOVED and not seq.handed_on:  # its replica failed
                lost.setdefault(seq.id, []).append(index)
                continue
            held = copies if seq.carried else seen
            if seq.id in held:
                raise AssertionError(f"{seq.id} is held by replicas {held[seq.id]} and {index}")
            held[seq.id] = index
    if copies != (decode_of or {}):
        wrong = sorted(set(copies.items()) ^ set((decode_of or {}).items()))[:5]
        raise AssertionError(f"decode copies and decode replicas disagree: {wrong}")
    want = {sample.id for s in specs for sample in sample_specs(s)}
    if set(seen) != want:
        missing = sorted(want - set(seen))[:5]
        extra = sorted(set(seen) - want)[:5]
        raise AssertionError(f"requests lost {missing} or unknown {extra} across the replicas")
    misrouted = [k for k, v in seen.items() if replica_of.get(k) != v]
    if misrouted:
        raise AssertionError(
            f"{misrouted[:5]} are held by another replica than they were routed to"
        )
    history = replicas_of or {}
    twice = [k for k, v in lost.items() if sorted(v) != sorted(history.get(k, [])[:-1])]
    twice += [k for k, v in history.items() if len(v) > 1 and k not in lost]
    if twice:
        raise AssertionError(f"{twice[:5]} were lost by replicas they were not placed on")
