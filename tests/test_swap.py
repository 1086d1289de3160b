"""Preemption by swap to a host KV tier (`engine.host_kv_memory_mb`, `preemption.mode`).

A swap moves only where a victim's KV waits, never which tokens it gets: greedy output is
the unpreempted run's, token for token, and nothing is computed twice. The two tiers' books
hold under any order of swaps, and the simulator makes the same swaps as the model.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from framework.api import EngineView, choose_mode
from framework.api.policy import PreemptionCosts
from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import Sequence, Status
from framework.engine.batch import Swaps
from framework.engine.block_pool import BlockPool, BlockPoolError
from framework.engine.counters import Counters
from framework.engine.host_tier import HostTier
from framework.engine.kv_cache import KVCache, bytes_per_block
from framework.executors.host_kv import HostKV
from framework.plugin_host.registry import registry
from framework.run.app import build_engine, load, model_dims
from framework.run.summary import summarize
from tests.helpers import assert_refused, check_same_greedy, cli, hf_greedy, make_cfg, run_engine

pytestmark = pytest.mark.usefixtures("one_thread")

TIGHT = ("model=tiny", "allocator=incremental", "engine.block_size=4", "engine.num_blocks=10")
HOST = "engine.host_kv_memory_mb=1"


def specs(n: int = 4, max_tokens: int = 20) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"r{i}",
            list(range(10 + i, 30 + i)),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("extra", [(), ("output=deferred", "window=4"), ("scheduler=chunked",)])
def test_swapped_victims_keep_their_greedy_tokens_and_compute_nothing_twice(
    tiny: Any, extra: tuple[str, ...]
) -> None:
    model, tok = tiny
    work = specs()
    refs = {s.id: hf_greedy(model, s.prompt_token_ids, 20, None) for s in work}
    res = run_engine(make_cfg(*TIGHT, HOST, "preemption.mode=swap", *extra), model, tok, work)
    m = summarize(res)
    assert m["preemptions"] > 0
    c = res.counters
    assert c.swapped_out_blocks > 0 and c.swap_fallbacks == 0
    assert c.swapped_in_blocks == c.swapped_out_blocks  # every victim came back
    assert c.recomputed_tokens == 0  # a swap computes nothing again
    assert c.swapped_out_bytes == c.swapped_out_blocks * c.swapped_out_bytes // c.swapped_out_blocks
    steps = res.steps
    assert sum(s.swapped_out for s in steps) == c.swapped_out_blocks
    assert sum(s.phase_s.get("swap", 0.0) for s in steps) > 0
    for seq in res.seqs:
        assert not seq.host_table
        check_same_greedy(
            model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
        )


def test_recompute_stays_the_default_and_swaps_nothing(tiny: Any) -> None:
    model, tok = tiny
    res = run_engine(make_cfg(*TIGHT, HOST), model, tok, specs())
    c = res.counters
    assert c.preemptions > 0 and c.recomputed_tokens > 0
    assert c.swapped_out_blocks == c.swapped_in_blocks == 0


def test_a_host_tier_too_small_for_a_victim_falls_back_to_recompute(tiny: Any) -> None:
    """Each victim holds more blocks than the tier: every swap falls back, counted, and the
    tokens are still the same."""
    model, tok = tiny
    work = specs()
    refs = {s.id: hf_greedy(model, s.prompt_token_ids, 20, None) for s in work}
    layers, kv_heads, head_dim = model_dims(model)
    block = bytes_per_block(layers, kv_heads, head_dim, 4, torch.float32)
    one_block_mb = 1.5 * block / 2**20  # a victim holds 5 blocks or more
    res = run_engine(
        make_cfg(*TIGHT, f"engine.host_kv_memory_mb={one_block_mb}", "preemption.mode=swap"),
        model,
        tok,
        work,
    )
    c = res.counters
    assert c.preemptions > 0 and c.swap_fallbacks > 0
    for seq in res.seqs:
        check_same_greedy(
            model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
        )


def test_the_simulator_makes_the_model_runs_swaps(tiny: Any) -> None:
    """Same engine, same policies: the simulated run preempts and swaps the same blocks."""
    model, tok = tiny
    work = specs()
    real = run_engine(make_cfg(*TIGHT, HOST, "preemption.mode=swap"), model, tok, work)
    cfg = make_cfg(*TIGHT, HOST, "preemption.mode=swap", "executor=simulated")
    shape, _, _, _ = load(cfg)
    sim = build_engine(cfg, shape, torch.device("cpu"), torch.float32, registry().pm.hook).run(
        work, tok.eos_token_id
    )
    for name in ("preemptions", "swapped_out_blocks", "swapped_in_blocks", "tokens_kept"):
        assert getattr(sim.counters, name) == getattr(real.counters, name), name
    assert sum(s.phase_s.get("swap", 0.0) for s in sim.steps) > 0


def view_with(costs: PreemptionCosts | None) -> EngineView:
    class Rules:
        def preemption_costs(self, seq: Sequence) -> PreemptionCosts | None:
            return costs

    return EngineView(0.0, 0, [], [], 0, 16, 10, 4, 64, lambda s: 1, rules=Rules())  # type: ignore[arg-type]


def test_cheaper_swaps_only_when_the_copies_cost_less_and_fit() -> None:
    seq = Sequence(RequestSpec("r", [1, 2, 3], SamplingParams(max_tokens=4)), None)
    assert choose_mode("cheaper", view_with(PreemptionCosts(1.0, 2.0, 3, 5)), seq) == "swap"
    assert choose_mode("cheaper", view_with(PreemptionCosts(3.0, 2.0, 3, 5)), seq) == "recompute"
    assert choose_mode("cheaper", view_with(PreemptionCosts(1.0, 2.0, 6, 5)), seq) == "recompute"
    assert choose_mode("cheaper", view_with(None), seq) == "recompute"
    assert choose_mode("swap", view_with(None), seq) == "swap"


def test_the_simulated_swap_cost_falls_with_the_block_size_and_cheaper_follows(tiny: Any) -> None:
    """vLLM copies block by block: at block size 1 a swap is thousands of small copies."""
    from framework.executors.simulated.links import host_links
    from framework.executors.simulated.swap_cost import SwapCost

    link = host_links()["pcie4_host"]
    per_token = 2 * 40 * 5120 * 2  # OPT-13B's K and V of one token, fp16
    costs = [SwapCost(link, 2 * 40, bs * per_token).seconds(256 // bs) for bs in (1, 16, 256)]
    assert costs[0] > costs[1] > costs[2]
    bytes_s = 256 * per_token / link.bandwidth
    assert costs[2] == pytest.approx(bytes_s, rel=0.1)  # at 256, nearly all bandwidth
    assert costs[0] > 10 * bytes_s  # at 1, nearly all per-copy latency


def test_the_executor_copies_blocks_out_and_back_exactly() -> None:
    cache = KVCache(2, 6, 4, 2, 8, torch.float32, torch.device("cpu"))
    for layer in (*cache.k, *cache.v):
        layer.copy_(torch.randn_like(layer))
    before = [t.clone() for t in (*cache.k, *cache.v)]
    host = HostKV(cache, 3)
    host.copy(cache, Swaps(out=((1, 0), (4, 2))))
    for layer in (*cache.k, *cache.v):  # the freed blocks are reused, overwritten
        layer.view(-1, 4, 2, 8)[1].zero_()
        layer.view(-1, 4, 2, 8)[4].zero_()
    host.copy(cache, Swaps(into=((0, 5), (2, 0))))
    for now, then in zip((*cache.k, *cache.v), before, strict=True):
        assert torch.equal(now.view(-1, 4, 2, 8)[5], then.view(-1, 4, 2, 8)[1])
        assert torch.equal(now.view(-1, 4, 2, 8)[0], then.view(-1, 4, 2, 8)[4])
    assert host.seconds_per_block() > 0


class Costs:
    def swap_seconds(self, blocks: int) -> float:
        return 0.001 * blocks

    def prefill_seconds(self, tokens: int) -> float:
        return 0.0001 * tokens


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["out", "in", "drop"]), st.integers(0, 5),
                          st.integers(1, 12)), max_size=40))  # fmt: skip
def test_the_two_tiers_books_hold_under_any_order_of_swaps(ops: list[tuple[str, int, int]]) -> None:
    """Device and host pools, six requests, random swaps out, readmissions and drops: no
    block owned twice, none in both tiers for one request, every host block a swapped
    request's, and all of it home at the end."""
    device, host = BlockPool(16, 4), BlockPool(8, 4)
    tier = HostTier(host, Counters(), 64, Costs())
    seqs = [
        Sequence(RequestSpec(f"r{i}", [1] * 4, SamplingParams(max_tokens=40)), None)
        for i in range(6)
    ]
    for s in seqs:
        s.status = Status.WAITING
    for op, i, tokens in ops:
        s = seqs[i]
        if op == "out" and not s.host_table:
            if not s.block_table:  # it runs first: blocks for what it computed
                n = device.blocks_for(tokens)
                if n > device.num_free:
                    continue
                s.block_table, s.num_computed = device.allocate(s.id, n), tokens
            if tier.swap_out(s):
                device.free(s.id, s.block_table)
                s.block_table = []
        elif op == "in" and s.host_table:
            n = len(s.host_table)
            if n > device.num_free:
                continue
            s.block_table = device.allocate(s.id, n)
            tier.swap_in(s)
            device.free(s.id, s.block_table)  # it runs and finishes
            s.block_table, s.num_computed = [], 0
        elif op == "drop":
            tier.drop(s)
        tier.take(runs=True)
        tier.check(seqs)
    for s in seqs:
        tier.drop(s)
        if s.block_table:
            device.free(s.id, s.block_table)
            s.block_table = []
    tier.check(seqs, end=True)
    device.check()
    assert device.num_used == 0


def test_a_step_that_runs_nothing_turns_its_swaps_into_recomputes() -> None:
    counters = Counters()
    device, host = BlockPool(8, 4), BlockPool(8, 4)
    tier = HostTier(host, counters, 64, Costs())
    s = Sequence(RequestSpec("r", [1] * 8, SamplingParams(max_tokens=4)), None)
    s.block_table, s.num_computed = device.allocate("r", 2), 8
    assert tier.swap_out(s)
    assert not tier.take(runs=False)
    assert not s.host_table and s.num_computed == 0 and host.num_used == 0
    assert counters.swap_fallbacks == 1 and counters.swapped_out_blocks == 0
    assert counters.recomputed_tokens == 8
    with pytest.raises(BlockPoolError, match="both tiers"):
        s.host_table = host.allocate("r", 1)
        tier.check([s])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("preemption.mode=swap",), "engine.host_kv_memory_mb > 0"),
        (("preemption.mode=sometimes", HOST), "preemption.mode must be one of"),
        (("engine.host_kv_memory_mb=-1",), "engine.host_kv_memory_mb must be >= 0"),
        ((HOST, "allocator=prefix_cache"), "caches no prefixes"),
        (("engine.host_kv_memory_mb=0.001",), "holds no block"),
        (("engine.host_kv_memory_mb=0.01", "preemption.mode=swap"), "too few for any request"),
    ],
)
def test_bad_host_tier_settings_are_one_line(
    capsys: Any, tmp_path: Any, args: tuple[str, ...], expected: str
) -> None:
    status, _, err = cli(
        capsys,
        "model=tiny",
        "workload=fixed",
        "workload.prompt_lens=[40,40]",
        "workload.output_lens=[8,8]",
        "observers=[]",
        f"hydra.run.dir={tmp_path}",
        *args,
    )
    assert_refused(status, err, expected)
