"""Parallel sampling: one request's `n` samples as sequences that share its prompt's KV.

A request with `SamplingParams.n` > 1 becomes `n` sequences, each a request of its own to
every policy (its own id, `<request id>#<index>`, its own seed stream, `n` = 1), tied by a
`SampleGroup` (`framework.core.sequence`). Only the first, the leader, waits for admission
at once; the others wait in the group until the leader's forward has computed the prompt up
to its last token. From
then on each of them is admitted over the leader's blocks (the fork): the full blocks of
the prompt are shared, reference-counted in the pool; the block the sample writes next (the
prompt's partly filled last block) is copied for it (copy on write), and it computes the
prompt's last token itself, sampling its first token from it. So no block that two tables
hold is ever written, and a sample preempted by recompute, or forked after its leader left,
computes its prompt again like any request: sharing saves memory and work, never changes
what a sample is.
"""

from __future__ import annotations

from dataclasses import replace

from framework.core.request import RequestSpec

SAMPLE_STEP = 0xD1B54A32D192ED03  # an odd 64-bit constant: sample seeds far apart
SEED_MOD = 2**63 - 1


def sample_seed(seed: int, index: int) -> int:
    """The seed stream of sample `index`: the request's own seed for the first, so one
    sample of a request draws what the request alone would."""
    return seed if index == 0 else (seed + index * SAMPLE_STEP) % SEED_MOD


def sample_id(request_id: str, index: int) -> str:
    return f"{request_id}#{index}"


def sample_specs(spec: RequestSpec) -> list[RequestSpec]:
    """The requests a request's samples (or beams: `framework.engine.beams`) are: itself
    when it has one."""
    sp = spec.sampling
    count = sp.sequences
    if count == 1:
        return [spec]
    return [
        replace(
            spec,
            id=sample_id(spec.id, i),
            sampling=replace(sp, n=1, seed=sample_seed(sp.seed, i)),
        )
        for i in range(count)
    ]
