"""Prefill/decode disaggregation: a request's KV moved from its prefill replica to a decode
replica, over a priced link, with every block accounted for.

A request sent to a `prefill` replica is prefilled there and its first token sampled there
(TTFT is stamped there, as DistServe and vLLM's disaggregated prefill do). The engine then
hands it off, parked with its blocks still held (`ReplicaHandOffs.take`). From there:

1. **Reservation.** The decode router (`router.decode`) picks one of the decode-capable
   replicas (`decode` and `mixed`), on a view of those alone, numbered 0..k-1. That
   replica's allocator prices the arriving KV (prompt and first token) as an admission
   and may decline (`ReplicaHandOffs.reserve`). Declined, the request waits at its prefill replica
   with its blocks held there, in a queue: after every step of any replica the queue is
   tried again from its head (the router asked again) until one is declined.
2. **Transfer.** Its KV (its computed tokens x layers x KV heads x head dim x dtype bytes x
   2, one GPU's shard) goes over the link (`framework.cluster.link`) from the reservation or
   the hand-off, whichever is later.
3. **Landing.** When it is done, the prefill replica frees its blocks (`sent`) and
   the decode replica takes the request (`accept`): it joins the running rows there as a
   decode row, from its second token, its prompt not computed again.

Invariants, checked as each step happens and again at the end (`check_end`): a request's KV
lives on exactly one replica except while in flight (held by both then); every reserved
block is filled by its transfer (none is ever given back unfilled); each request is handed
off at most once and reserved for once; transfers <= requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from framework.api.policy import PolicyError
from framework.api.router import ClusterView, ReplicaView, Router, snapshot
from framework.cluster.link import Link, Overlap, Transfer, TransferRecord
from framework.cluster.replica_handoffs import HandOff, ReplicaHandOffs
from framework.core.sequence import Sequence, Status
from framework.engine.invariants import InvariantError
from framework.engine.loop import Engine
from framework.plugin_host.guard import Guarded


@dataclass(frozen=True)
class KVShape:
    """What a token's KV weighs on one GPU of a replica (its shard under tensor
    parallelism: layers x KV heads per GPU x head dim x dtype bytes x 2 for K and V), and
    how many GPUs move a shard each at once (one over each GPU's port)."""

    bytes_per_token: int
    layers: int
    shards: int = 1


@dataclass(frozen=True)
class Moving:
    """A transfer's payload: the request on each side."""

    original: Sequence
    copy: Sequence
    handed_at: float


class Disaggregation:
    """The hand-off queue, the decode router's choices, the link and the records."""

    def __init__(
        self,
        engines: list[Engine],
        roles: list[str],
        router: Router,
        name: str,
        provider: str | None,
        link: Link,
        kv: KVShape,
        layerwise: bool = False,
    ) -> None:
        self.engines = engines
        # Every replica may hand off or receive: each keeps the books of its parked requests.
        self.books = [ReplicaHandOffs(e) for e in engines]
        self.roles = roles
        self.decoders = [i for i, r in enumerate(roles) if r in ("decode", "mixed")]
        if not self.decoders:
            raise ValueError("cluster.roles leave no decode-capable replica (decode or mixed)")
        self.views = tuple(ReplicaView(j, engines[i]) for j, i in enumerate(self.decoders))
        self.router = Guarded(router, "router", name, provider)
        self.name = name
        self.provider = provider
        self.link = link
        self.kv = kv
        self.layerwise = layerwise
        # At their prefill replica, in hand-off order: (replica, hand-off, the `place` call
        # it came before: a later one means it waited).
        self.unreserved: deque[tuple[int, HandOff, int]] = deque()
        self._placing = 0
        self.decode_of: dict[str, int] = {}
        self.records: list[TransferRecord] = []

    # ---- hand-offs and reservations --------------------------------------------------
    def collect(self, src: int) -> None:
        """The hand-offs of replica `src`'s last step join the back of the queue."""
        for h in self.books[src].take():
            if h.seq.status is not Status.PARKED or h.seq.id in self.decode_of:
                raise InvariantError(f"{h.seq.id} handed off twice, or not after its prefill")
            self.unreserved.append((src, h, self._placing))

    def place(self, now: float) -> list[int]:
        """Reserve and send from the head of the queue until a decode replica declines;
        `now` is the time of the event that may have freed blocks (the end of a step). A
        hand-off placed at the event that handed it off starts at its own time; one that
        waited, when the blocks were found. Returns the replicas given a reservation."""
        placed: list[int] = []
        fresh = self._placing
        self._placing += 1
        while self.unreserved:
            src, h, since = self.unreserved[0]
            start = h.at if since == fresh else max(now, h.at)
            view = snapshot(start, self.views, h.seq.spec)
            dst = self.decoders[self._choose(view, h.seq)]
            copy = self.books[dst].reserve(h.seq)
            if copy is None:  # it waits at its prefill replica, its blocks held there
                break
            self.unreserved.popleft()
            self.decode_of[h.seq.id] = dst
            overlap = None
            if self.layerwise and start == h.at and self.kv.layers > 0:
                overlap = Overlap(h.forward_s / self.kv.layers, self.kv.layers)
            tokens = h.seq.num_computed
            self.link.send(
                Transfer(
                    src,
                    dst,
                    float(tokens * self.kv.bytes_per_token),
                    start,
                    overlap,
                    Moving(h.seq, copy, h.at),
                )
            )
            placed.append(dst)
        return placed

    def _choose(self, view: ClusterView, seq: Sequence) -> int:
        """The decode router's choice, checked: an index of its view (PolicyError else)."""
        chosen = self.router.route(view, seq.spec)
        if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < len(view):
            tag = f" ({self.provider})" if self.provider else ""
            raise PolicyError(
                f"router policy {self.name!r}{tag} (router.decode): chose {chosen!r} for "
                f"{seq.id}'s decode; its view has decode-capable replicas 0..{len(view) - 1}"
            )
        return chosen

    # ---- the link's events ------------------------------------------------------------
    def next_time(self) -> float:
        return self.link.next_time()

    def advance(self, t: float) -> list[tuple[int, int]]:
        """The link's events at `t`: each transfer done frees its blocks on its prefill
        replica and lands on its decode replica. Returns (src, dst) of each one done."""
        moved: list[tuple[int, int]] = []
        for tr in self.link.advance(t):
            m: Moving = tr.payload
            self.books[tr.src].sent(m.original, t)
            self.books[tr.dst].accept(m.copy, t)
            self.records.append(
                TransferRecord(
                    m.original.id,
                    tr.src,
                    tr.dst,
                    int(tr.bytes) * self.kv.shards,
                    m.handed_at,
                    tr.start,
                    t,
                )
            )
            moved.append((tr.src, tr.dst))
        return moved

    @property
    def pending(self) -> bool:
        """Hand-offs waiting for a reservation or transfers not yet done."""
        return bool(self.unreserved or self.link.busy)

    # ---- the end -----------------------------------------------------------------------
    def stuck(self) -> PolicyError:
        """Nothing left to happen, yet requests wait for a decode replica's blocks: every
        decode-capable replica is idle and its allocator still declines."""
        src, h, _ = self.unreserved[0]
        return PolicyError(
            f"{len(self.unreserved)} requests wait at their prefill replicas for a decode "
            f"replica's blocks, the first {h.seq.id} ({h.seq.num_tokens} tokens, at replica "
            f"{src}), and every decode-capable replica is idle: their allocators decline it"
        )

    def check_end(self, requests: int) -> None:
        """Every hand-off transferred, every reservation filled, the books of each side,
        and the tokens each side kept adding up to what the requests hold."""
        if self.pending:
            raise InvariantError("hand-offs or transfers left at the end of the run")
        if len(self.records) != len(self.decode_of) or len(self.records) > requests:
            raise InvariantError(
                f"{len(self.records)} transfers for {len(self.decode_of)} reservations and "
                f"{requests} requests"
            )
        for i, books in enumerate(self.books):
            if books or books.landed:
                raise InvariantError(f"replica {i} still holds KV for a transfer")
        for r in self.records:
            if self.decode_of.get(r.id) != r.dst:
                raise InvariantError(f"{r.id} was sent to replica {r.dst}, reserved elsewhere")
        final: dict[str, Sequence] = {}
        for e in self.engines:
            for s in e.seqs:
                if s.carried or s.id not in final:
                    final[s.id] = s
        held = sum(len(s.output_token_ids) for s in final.values())
        kept = sum(e.counters.tokens_kept for e in self.engines)
        if held != kept:
            raise InvariantError(f"the replicas kept {kept} tokens; the requests hold {held}")
