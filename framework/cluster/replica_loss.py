"""A replica lost (a cluster's `cluster.faults`): what it held goes, with its books closed.
The cluster does it to the engine through the engine's own primitives (the planner's queues
and its one release, the held tokens' `lose_all`, the pool's `forget_all`); one engine knows
nothing of failures.

A replica that fails loses its device: its KV cache and the sampled tokens still on it (held
by the output policy) are gone. What its clients already received stays theirs. So each
request it held that had not finished leaves it (`Status.MOVED`, its blocks back in the
pool, its prefix cache forgotten), and a copy of it (`Sequence.copy_for`) carrying the
tokens already delivered goes back to the router, to be computed again on a live replica
from its prompt plus those tokens: no client sees a token twice, and greedy decoding gives
the tokens a fault-free run gives.

The books stay whole on the lost replica too: every block is free after the loss; the
tokens that died on the device are counted (`Counters.lost_tokens`), so token conservation
still holds (`deferred = kept + overshoot + lost`); the positions computed there that the
new replica must compute again are counted (`Counters.failure_recomputed_tokens`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.core.sequence import Sequence, Status
from framework.engine.invariants import InvariantError

if TYPE_CHECKING:
    from framework.engine.loop import Engine


def lose_replica(engine: Engine) -> list[Sequence]:
    """Fail `engine`, a replica, now: every unfinished request it holds leaves it, lost, and
    its copies to re-route are returned, oldest arrival first. Finished rows a static batch
    still keeps are released as finished (their clients have every token); the aborts it
    was to carry out at its next step are dropped with the rest."""
    engine.aborts.forget_all()
    planner = engine.planner
    counters = planner.counters
    if planner.parking:
        raise InvariantError("a replica holding KV hand-offs cannot fail (cluster.roles)")
    now = planner.now()
    counters.lost_tokens += planner.held.lose_all()  # sampled on the device, never read back
    lost: list[Sequence] = []
    for seq in planner.empty():
        if seq.status in (Status.WAITING, Status.PENDING):  # no device blocks
            # a victim swapped to the host tier loses that KV with the replica too
            counters.failure_recomputed_tokens += seq.num_computed if seq.host_table else 0
            planner.release(seq, Status.MOVED, now)
        elif seq.finish_reason is not None:  # every token delivered: it finished here
            planner.release(seq, Status.RELEASED, now)
            continue
        else:
            counters.failure_recomputed_tokens += min(seq.num_computed, seq.num_tokens)
            planner.release(seq, Status.MOVED, now)
        lost.append(seq)
    planner.pool.forget_all()
    lost.sort(key=lambda s: s.arrival)
    return [seq.copy_for(kv_sent=False) for seq in lost]
