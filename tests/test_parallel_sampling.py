"""Parallel sampling (`sampling.n`): a request's samples forked over one copy of its prompt.

Sharing saves memory and work and never changes what a sample is: each sample's tokens are
the request's alone under its sample's seed (greedy: the request's own, so `n` greedy
samples are `n` copies of one answer), whatever the policies, preemptions and output
windows (the property tests draw `n` too). The pool's books hold under any order of forks
and frees, no row ever writes into a block two tables hold, the simulator forks as the
model does, and the server answers `n` choices, whole and streamed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sample_group import sample_seed, sample_specs
from framework.core.sequence import Sequence
from framework.engine.batch import Row, StepBatch
from framework.engine.block_pool import BlockPool, BlockPoolError
from framework.engine.invariants import InvariantError, check_writes
from framework.engine.prefix_cache import PrefixCachingPool
from framework.plugin_host.registry import registry
from framework.run.app import build_engine, build_runner, load
from framework.run.summary import summarize
from tests.helpers import assert_refused, cli, hf_greedy, make_cfg, run_engine

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ("model=tiny", "engine.block_size=4")
PROMPTS = [list(range(10 + i, 10 + i + n)) for i, n in enumerate((22, 25, 28))]


def specs(n: int, temperature: float = 0.0, max_tokens: int = 12) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"r{i}",
            p,
            SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, n=n, temperature=temperature, seed=i
            ),
        )
        for i, p in enumerate(PROMPTS)
    ]


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("output=deferred", "window=4"),
        ("scheduler=chunked", "engine.max_num_batched_tokens=8", "engine.max_num_seqs=4"),
        ("allocator=prefix_cache",),
        ("allocator=incremental", "engine.num_blocks=24"),  # preempts
        ("allocator=incremental", "engine.num_blocks=24", "engine.host_kv_memory_mb=1",
         "preemption.mode=swap"),
        ("engine.kv_layout=contiguous", "allocator=worst_case"),  # extents: nothing shared
    ],
    ids=["default", "deferred", "chunked", "prefix_cache", "preempted", "swapped", "contiguous"],
)  # fmt: skip
def test_greedy_samples_are_copies_of_the_requests_answer(tiny: Any, extra: tuple) -> None:
    model, tok = tiny
    res = run_engine(make_cfg(*BASE, *extra), model, tok, specs(3))
    outs = {s.id: s.output_token_ids for s in res.seqs}
    assert len(outs) == 9
    for i, prompt in enumerate(PROMPTS):
        want = hf_greedy(model, prompt, 12, None)
        assert [outs[f"r{i}#{k}"] for k in range(3)] == [want] * 3
    m = summarize(res)
    if "engine.kv_layout=contiguous" in extra:
        assert m["forks"] == 0  # an extent is its own: each sample computes its prompt
    else:
        assert m["forks"] > 0 and m["kv_sharing_saving"] > 0


def test_each_sample_draws_what_the_request_alone_draws_with_its_seed(tiny: Any) -> None:
    """Sample 0 draws with the request's seed, sample k with its own stream: the same
    tokens as a request of one sample with that seed, served alone."""
    model, tok = tiny
    forked = run_engine(make_cfg(*BASE), model, tok, specs(3, temperature=0.9))
    outs = {s.id: s.output_token_ids for s in forked.seqs}
    for i in range(len(PROMPTS)):
        draws = [outs[f"r{i}#{k}"] for k in range(3)]
        assert len({tuple(d) for d in draws}) == 3  # three streams, three answers
        for k in range(3):
            alone = RequestSpec(
                "x",
                PROMPTS[i],
                SamplingParams(
                    max_tokens=12, ignore_eos=True, temperature=0.9, seed=sample_seed(i, k)
                ),
            )
            (seq,) = run_engine(make_cfg(*BASE), model, tok, [alone]).seqs
            assert seq.output_token_ids == draws[k]
    assert sample_seed(5, 0) == 5  # one sample of a request is the request


def test_forks_share_the_prompts_full_blocks_and_copy_the_one_they_write(tiny: Any) -> None:
    """Prompts of 22, 25 and 28 tokens in blocks of 4: a fork shares the full blocks before
    the prompt's last token (5, 6 and 6 of them) and copies the partly filled one (when
    the last token does not start a block: 22 and 28 tokens, 25 - 1 = 24 fills 6)."""
    model, tok = tiny
    res = run_engine(make_cfg(*BASE), model, tok, specs(3))
    c = res.counters
    assert c.forks == 6  # two followers a request
    assert c.forked_blocks == 2 * (5 + 6 + 6)
    assert c.cow_blocks == 2 * 2
    # a fork computes the prompt's last token only
    assert c.prefill_tokens == sum(len(p) for p in PROMPTS) + c.forks
    # the steps (steps.csv) carry the copies and the references above the blocks in use
    assert sum(s.copied_blocks for s in res.steps) == c.cow_blocks
    assert max(s.block_references - s.blocks_in_use for s in res.steps) >= 2 * 5
    assert all(s.block_references >= s.blocks_in_use for s in res.steps)


def test_the_simulator_forks_as_the_model_does(tiny: Any) -> None:
    model, tok = tiny
    work = specs(3)
    over = (*BASE, "allocator=incremental", "engine.num_blocks=24")
    real = run_engine(make_cfg(*over), model, tok, work)
    cfg = make_cfg(*over, "executor=simulated")
    shape, _, _, _ = load(cfg)
    sim = build_engine(cfg, shape, torch.device("cpu"), torch.float32, registry().pm.hook).run(
        work, tok.eos_token_id
    )
    for name in ("forks", "forked_blocks", "cow_blocks", "preemptions", "tokens_kept"):
        assert getattr(sim.counters, name) == getattr(real.counters, name), name
    assert sim.counters.forks > 0


def test_a_row_writing_into_a_shared_block_is_caught() -> None:
    pool = BlockPool(8, 4)
    a = pool.allocate("a", 2)
    pool.fork("b", a[:1])
    holders = []
    for name, table in (("a", a), ("b", a[:1])):
        seq = Sequence(RequestSpec(name, [7] * 3, SamplingParams()), None)
        seq.block_table = table
        holders.append(seq)
    row = Row("b", [7], 2, [a[0] * 4 + 2], a[:1], 3, SamplingParams(), token_index=0)
    pool.check_tables({s.id: s.block_table for s in holders})  # the books are whole
    with pytest.raises(InvariantError, match="a write into a shared block"):
        check_writes(StepBatch([row]), pool)


@pytest.mark.parametrize("caching", [False, True], ids=["paged", "prefix_cache"])
@given(
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7), st.integers(1, 3)), max_size=60)
)
def test_pool_books_hold_under_any_forks_and_frees(caching: bool, ops: list) -> None:  # fmt: skip
    """Random allocations, forks of another table's leading blocks, and frees: every block's
    count equals its holders, none is free while held, none held twice by one table, and
    all are free at the end."""
    pool: BlockPool = PrefixCachingPool(16, 4) if caching else BlockPool(16, 4)
    tables: dict[str, list[int]] = {}
    for kind, who, n in ops:
        owner = f"t{who}"
        if owner in tables:
            if kind < 2:  # free it
                pool.free(owner, tables.pop(owner))
            continue
        others = [t for t in tables.values() if t]
        if kind >= 3 and others:  # fork the leading blocks of another, then grow
            shared = others[who % len(others)][:n]
            pool.fork(owner, shared)
            grown = pool.allocate(owner, 1) if pool.num_free else []
            tables[owner] = shared + grown
        elif n <= pool.num_free:
            tables[owner] = pool.allocate(owner, n)
        pool.check()
        pool.check_tables(tables)
        for b in range(16):
            holders = sum(t.count(b) for t in tables.values())
            assert pool.refcount(b) == holders
        with pytest.raises(BlockPoolError):
            if tables:
                some = next(iter(tables.values()))
                if some:
                    pool.fork(next(iter(tables)), some[:1])  # a table holds a block once
            raise BlockPoolError("nothing to fork")
    for owner, table in tables.items():
        pool.free(owner, table)
    pool.check()
    assert pool.num_used == 0 and pool.references() == 0


def test_bad_sample_counts_are_refused(capsys: Any) -> None:
    status, _, err = cli(capsys, "model=tiny", "workload.n=5", "engine.max_num_seqs=4")
    assert_refused(status, err, "workload.n=5 samples of a request cannot run side by side")
    status, _, err = cli(capsys, "model=tiny", "workload.n=0")
    assert_refused(status, err, "workload.n must be >= 1")
    with pytest.raises(ValueError, match=r"sampling\.n must be an integer >= 1"):
        SamplingParams(n=0)


def test_samples_are_lines_of_outputs_jsonl(capsys: Any, tmp_path: Any) -> None:
    status, _, err = cli(
        capsys, "model=tiny", "workload=fixed", "workload.prompt_lens=[9]",
        "workload.output_lens=[3]", "workload.n=2", f"hydra.run.dir={tmp_path}", "observers=[]",
    )  # fmt: skip
    assert status == 0, err
    lines = [json.loads(x) for x in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert [(x["id"], x["request_id"], x["index"]) for x in lines] == [
        ("r0#0", "r0", 0),
        ("r0#1", "r0", 1),
    ]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["forks"] == 1 and metrics["requests"] == 2


def test_a_requests_samples_abort_together_before_and_after_the_fork(tiny: Any) -> None:
    """Aborted while its samples wait in their group (not yet forked), and while they run:
    every sample ends, every block is home (the engine's end check)."""
    _, tok = tiny
    cfg = make_cfg(*BASE)
    shape, _, _, _ = load(cfg)
    engine = build_engine(cfg, shape, torch.device("cpu"), torch.float32, registry().pm.hook)
    engine.prepare()
    engine.clock.start()
    early = engine.submit(specs(3)[0], tok.eos_token_id)
    late = engine.submit(specs(3)[1], tok.eos_token_id)
    for seq in early:  # before any step: the leader waits, the others are in the group
        engine.abort(seq)
    for _ in range(3):
        engine.advance()
    assert any(s.block_table for s in late[1:])  # forked and running
    for seq in late:
        engine.abort(seq)
    while engine.has_work:
        engine.advance()
    engine.finish()
    assert all(s.finish_reason == "abort" for s in early)
    assert [s.sample_index for s in late] == [0, 1, 2]
    assert sample_specs(specs(1)[0]) == [specs(1)[0]]


def test_samples_of_a_later_arrival_neither_stall_nor_spin(tiny: Any) -> None:
    """With nothing running and a request of several samples still to arrive, the engine
    waits for its arrival on the clock instead of stepping on the spot: the run ends within
    a bounded number of calls, every sample served."""
    _, tok = tiny
    cfg = make_cfg(*BASE, "executor=simulated")
    shape, _, _, _ = load(cfg)
    engine = build_engine(cfg, shape, torch.device("cpu"), torch.float32, registry().pm.hook)
    engine.prepare()
    engine.clock.start()
    work = specs(2, max_tokens=4)
    work[1].arrival = 30.0
    for spec in work:
        engine.submit(spec, tok.eos_token_id)
    calls = 0
    while engine.has_work and calls < 500:
        engine.advance()
        calls += 1
    assert not engine.has_work, f"still busy after {calls} calls"
    result = engine.finish()
    assert sorted(len(s.output_token_ids) for s in result.seqs) == [4] * 6
    assert engine.now() >= 30.0


@pytest.mark.parametrize(
    "cluster",
    [
        ("cluster.replicas=2", "router=round_robin"),
        ("cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link=pcie"),
    ],
    ids=["replicas", "prefill-decode"],
)
def test_a_cluster_serves_each_sample_once_with_one_engines_tokens(
    tiny: Any, cluster: tuple[str, ...]
) -> None:
    """A request's samples go to one replica and fork there; a prefill replica hands each
    sample on after its first token. Every sample is served once (the cluster's own check),
    with the tokens one engine gives it."""
    _, tok = tiny
    sim = (*BASE, "executor=simulated", "observers=[]", "executor.mean_output_tokens=6")
    work = specs(2, temperature=0.8, max_tokens=6)

    def run(*over: str) -> Any:
        cfg = make_cfg(*sim, *over)
        shape, _, _, _ = load(cfg)
        return build_runner(cfg, shape, torch.device("cpu"), torch.float32, registry().pm.hook)

    result = run(*cluster).run(work, tok.eos_token_id)
    alone = run().run(work, tok.eos_token_id)
    mine = {s.id: s.output_token_ids for s in result.seqs if s.finish_reason is not None}
    assert mine == {s.id: s.output_token_ids for s in alone.seqs}
    assert len(mine) == 6
