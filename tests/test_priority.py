"""Priority scheduling end to end: an urgent arrival displaces a running, less urgent request
(preempted by recompute), finishes first, and no text changes."""

from __future__ import annotations

from framework.core.request import RequestSpec, SamplingParams
from framework.run.summary import summarize
from tests.helpers import make_cfg, run_engine


def test_urgent_arrival_displaces_a_running_request(tiny) -> None:
    model, tok = tiny
    low = RequestSpec(
        "low", list(range(20, 40)), SamplingParams(max_tokens=200, ignore_eos=True), priority=5
    )
    urgent = RequestSpec(
        "urgent",
        list(range(50, 60)),
        SamplingParams(max_tokens=8, ignore_eos=True),
        arrival=0.02,
        priority=0,
    )
    base = ["model=tiny", "engine.max_num_seqs=1"]
    alone = {
        s.id: run_engine(make_cfg(*base), model, tok, [s]).seqs[0].output_token_ids
        for s in (low, urgent)
    }
    res = run_engine(
        make_cfg(*base, "scheduler=priority", "preemption=priority"), model, tok, [low, urgent]
    )
    by_id = {s.id: s for s in res.seqs}
    assert by_id["low"].preemptions >= 1
    assert summarize(res)["preemptions"] >= 1
    assert by_id["urgent"].finished_at < by_id["low"].finished_at
    assert {k: s.output_token_ids for k, s in by_id.items()} == alone


def test_fcfs_scheduler_never_displaces(tiny) -> None:
    model, tok = tiny
    low = RequestSpec(
        "low", list(range(20, 40)), SamplingParams(max_tokens=60, ignore_eos=True), priority=5
    )
    urgent = RequestSpec(
        "urgent",
        list(range(50, 60)),
        SamplingParams(max_tokens=8, ignore_eos=True),
        arrival=0.01,
        priority=0,
    )
    res = run_engine(make_cfg("model=tiny", "engine.max_num_seqs=1"), model, tok, [low, urgent])
    by_id = {s.id: s for s in res.seqs}
    assert summarize(res)["preemptions"] == 0
    assert by_id["low"].finished_at < by_id["urgent"].finished_at
