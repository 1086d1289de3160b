"""`Engine.abort`: a request ended from outside (its client went away, a stop string) in any
state frees what it holds, is counted, and leaves the engine's books whole (`check_end`), for
every allocator and with tokens held on the device by deferred output."""

from __future__ import annotations

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import ABORTED, STOP_STRING, Status
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from framework.run.summary import summarize
from tests.helpers import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread")

ALLOCATORS = ["incremental", "worst_case", "prefix_cache"]
# Kernels set rather than timed (`auto`): what an abort frees and counts is the engine's
# bookkeeping, the same whichever kernels run, and a process's first timed engine pays for
# building and measuring every kernel.
FIXED = [
    "engine.packed_linears=false",
    "engine.paged_kernel=false",
    "engine.argmax_kernel=false",
    "engine.layer_glue=false",
]
OUTPUTS = [["output=immediate"], ["output=deferred", "window=4"]]


def specs(n: int) -> list[RequestSpec]:
    shared = list(range(10, 42))  # a shared prefix: the prefix cache holds its blocks
    return [
        RequestSpec(
            f"r{i}",
            [*shared, 100 + i, 200 + i],
            SamplingParams(max_tokens=12, ignore_eos=True),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("output", OUTPUTS, ids=["immediate", "deferred"])
def test_abort_in_every_state_closes_the_books(tiny, allocator: str, output: list[str]) -> None:
    model, tok = tiny
    cfg = make_cfg(
        "model=tiny",
        *FIXED,
        f"allocator={allocator}",
        *output,
        "engine.max_num_seqs=2",
        "engine.block_size=4",
        "engine.num_blocks=40",
    )
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    engine.prepare()
    engine.clock.start()
    seqs = [engine.submit(s, tok.eos_token_id)[0] for s in specs(5)]
    engine.advance()  # r0, r1 run; r2..r4 wait
    engine.advance()
    engine.advance()
    assert seqs[0].status is Status.RUNNING and seqs[2].status is Status.WAITING
    if output[0] == "output=deferred":
        assert seqs[0].num_held > 0  # tokens on the device when the abort comes
    engine.abort(seqs[0])  # running
    engine.abort(seqs[2])  # waiting: ends at once
    engine.abort(seqs[3], STOP_STRING)
    assert seqs[2].status is Status.RELEASED and seqs[2].finish_reason == ABORTED
    (late,) = engine.submit(RequestSpec("late", [1, 2, 3], SamplingParams(max_tokens=4)), None)
    engine.abort(late)  # pending: it never joins the queue
    assert engine.pool.num_used > 0
    engine.advance()
    assert seqs[0].status is Status.RELEASED and seqs[0].finish_reason == ABORTED
    assert not seqs[0].block_table and seqs[0] not in engine.running
    kept = len(seqs[0].output_token_ids)
    assert 1 <= kept < 12  # its held tokens came home before it left
    while engine.has_work:
        engine.advance()
    engine.abort(seqs[1])  # finished already: nothing changes
    result = engine.finish()  # check_end: every block home, every token accounted for
    assert seqs[1].finish_reason == "length" and len(seqs[1].output_token_ids) == 12
    assert seqs[4].finish_reason == "length"
    assert engine.pool.num_used == 0
    summary = summarize(result)
    assert summary["aborted"] == 3 and summary["stop_strings"] == 1
    assert summary["requests_finished"] == 3  # r1, r3 (stop string) and r4


def test_abort_reason_must_be_an_outside_one(tiny) -> None:
    model, tok = tiny
    cfg = make_cfg("model=tiny", *FIXED)
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    (seq,) = engine.submit(specs(1)[0], tok.eos_token_id)
    with pytest.raises(ValueError, match="abort reason"):
        engine.abort(seq, "length")
