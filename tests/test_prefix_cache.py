"""Prefix caching (`allocator=prefix_cache`, `framework/engine/prefix_cache.py`): the pool's
books (reference counts, the LRU of cached free blocks, tail-first eviction, hits compared
token by token), and the engine's use of it: greedy output identical with the cache on and
off (and to HF `generate`), under FCFS and chunked prefill, with preemption and deferred
output, with fewer prefill tokens computed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import framework.engine.prefix_cache as prefix_cache
from framework.engine.block_pool import BlockPoolError
from framework.engine.prefix_cache import PrefixCachingPool
from framework.run.summary import summarize
from framework.workloads import build_workload
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, run_engine

BS = 4

pytestmark = pytest.mark.usefixtures("one_thread")


def published(pool: PrefixCachingPool, owner: str, tokens: list[int]) -> list[int]:
    """`owner` takes blocks for `tokens`, and publishes the full ones (as after a forward)."""
    table = pool.allocate(owner, -(-len(tokens) // BS))
    pool.publish(owner, table, tokens, 0)
    return table


# ---- the pool's books ----------------------------------------------------------------------


def test_a_hit_shares_blocks_and_counts_references() -> None:
    pool = PrefixCachingPool(8, BS)
    a = published(pool, "a", list(range(10)))  # 2 full blocks published, 1 partial
    hits = pool.match([*range(9), 99], max_blocks=2)
    assert hits == a[:2]
    assert pool.match([0, 1, 2, 7, 4, 5, 6, 7], 2) == []  # the first block differs: no chain
    pool.share("b", hits)
    assert [pool.refcount(b) for b in a] == [2, 2, 1]
    assert pool.num_used == 3 and pool.num_free == 5
    pool.check_tables({"a": a, "b": hits})
    with pytest.raises(BlockPoolError, match="reference count 2, in 1 tables"):
        pool.check_tables({"a": a})
    pool.free("a", a)  # b still holds the two shared blocks; a's partial block is free again
    assert pool.num_used == 2 and pool.num_cached == 0 and pool.num_free == 6
    pool.free("b", hits)
    assert pool.num_used == 0 and pool.num_cached == 2 and pool.num_free == 8
    pool.check()


def test_cached_blocks_are_evicted_lru_the_tail_of_a_prompt_first() -> None:
    pool = PrefixCachingPool(4, BS)
    a = published(pool, "a", list(range(16)))  # four full blocks
    pool.free("a", a)
    assert pool.num_cached == 4 and pool.num_free == 4
    (got,) = pool.allocate("b", 1)  # nothing free: the oldest cached block, the tail
    assert got == a[3] and pool.evictions == 1
    assert pool.match(list(range(16)), 4) == a[:3]  # the head still hits
    pool.check()


def test_a_hash_collision_does_not_hand_over_another_prefix(monkeypatch: Any) -> None:
    """Every hit compares the block's tokens, so even a hash that collides on everything
    cannot make one prompt read another's keys."""
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens, salt: b"same")
    pool = PrefixCachingPool(4, BS)
    published(pool, "a", [1, 2, 3, 4])
    assert pool.match([5, 6, 7, 8], 1) == []
    assert pool.match([1, 2, 3, 4, 9], 1) != []


def test_a_duplicate_block_stays_private_and_its_children_still_chain() -> None:
    """Two requests computed the same prefix in one step: one block publishes it, the other
    stays private, and the private one's next block is hashed through it correctly."""
    pool = PrefixCachingPool(8, BS)
    first = published(pool, "a", [1, 2, 3, 4])
    second = published(pool, "b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert pool.match([1, 2, 3, 4, 5, 6, 7, 8, 0], 2) == [first[0], second[1]]
    assert pool.match([5, 6, 7, 8], 1) == []  # b's second block is not a first block
    pool.free("b", second)
    # a still holds the published first block; b's duplicate went back to the free list and
    # b's second block, published, is cached.
    assert pool.num_used == 1 and pool.num_cached == 1 and pool.num_free == 7
    pool.check()


def test_the_salt_keeps_models_apart() -> None:
    pool = PrefixCachingPool(4, BS, salt="model-a:float32")
    other = PrefixCachingPool(4, BS, salt="model-b:float32")
    published(pool, "a", [1, 2, 3, 4])
    published(other, "a", [1, 2, 3, 4])
    assert pool._hash[0] != other._hash[0]


# ---- the per-step table check at scale -----------------------------------------------------

WATCH = 4096  # the tests' whole-check budget: a schedule short enough to watch in a few steps
PREFIX = 8  # blocks every table shares


def big_tables(rows: int = 100, blocks: int = 90) -> tuple[PrefixCachingPool, dict[str, list[int]]]:
    """Running tables with more than `WATCH` entries (so the per-step check
    takes its incremental path), all but the last sharing one published prefix, just
    checked whole."""
    pool = PrefixCachingPool(rows * blocks, BS)
    pool.CHECK_ENTRIES_PER_STEP = WATCH
    head = published(pool, "r0", list(range(PREFIX * BS)))
    tables = {"r0": head + pool.allocate("r0", blocks - PREFIX)}
    for i in range(1, rows - 1):
        pool.share(f"r{i}", head)
        tables[f"r{i}"] = head + pool.allocate(f"r{i}", blocks - PREFIX)
    tables[f"r{rows - 1}"] = pool.allocate(f"r{rows - 1}", blocks)  # a prefix of its own
    assert sum(map(len, tables.values())) > WATCH
    pool.check_tables_full(tables)
    return pool, tables


def count_full_checks(pool: PrefixCachingPool, monkeypatch: Any) -> list[int]:
    """For each whole check `check_tables` runs from now on, the steps since the last one."""
    gaps: list[int] = []
    full = pool.check_tables_full

    def spy(tables: dict[str, list[int]]) -> None:
        gaps.append(pool._steps_since_full)
        full(tables)

    monkeypatch.setattr(pool, "check_tables_full", spy)
    return gaps


def steps_to_full(tables: dict[str, list[int]]) -> int:
    """How many steps after a whole check the schedule runs the next one."""
    return -(-sum(map(len, tables.values())) // WATCH)


def test_small_tables_get_the_whole_check_every_step() -> None:
    pool = PrefixCachingPool(64, BS)
    tables = {"a": pool.allocate("a", 10), "b": pool.allocate("b", 10)}
    pool.check_tables(tables)
    pool._owners[tables["a"][3]].append("a")  # a holds a block twice: its count is off
    with pytest.raises(BlockPoolError, match="reference count 2, in 1 tables"):
        pool.check_tables(tables)


def test_large_tables_get_the_whole_check_on_schedule(monkeypatch: Any) -> None:
    """Between whole checks, rows grow, leave and are re-admitted with new tables; every
    step passes, and the whole check runs once the steps times its per-step budget reach
    the entries."""
    pool, tables = big_tables()
    assert PrefixCachingPool.CHECK_ENTRIES_PER_STEP < WATCH  # the engine's is finer
    full = count_full_checks(pool, monkeypatch)
    assert steps_to_full(tables) == 3
    for step in range(1, 10):
        for owner in list(tables)[:50]:
            tables[owner] += pool.allocate(owner, 1)  # in place, as the engine grows a row
        if step == 4:
            pool.free("r7", tables.pop("r7"))  # r7 leaves; r8 is re-admitted with a new table
            pool.free("r8", tables["r8"])
            pool.share("r8", tables["r0"][:PREFIX])
            tables["r8"] = tables["r0"][:PREFIX] + pool.allocate("r8", 90 - PREFIX)
        pool.check_tables(tables)
    assert full == [3, 3, 3]
    pool.check_tables_full(tables)
    pool.check()


def test_a_new_entry_its_owner_does_not_hold_is_caught_at_once(monkeypatch: Any) -> None:
    pool, tables = big_tables()
    full = count_full_checks(pool, monkeypatch)
    (b,) = pool.allocate("r1", 1)
    tables["r0"].append(b)  # r1's block in r0's table: the totals still agree
    with pytest.raises(BlockPoolError, match=f"r0's table has block {b}, held by \\['r1'\\]"):
        pool.check_tables(tables)
    assert full == []  # the incremental check found it


def test_a_new_entry_in_the_lru_list_is_caught_at_once(monkeypatch: Any) -> None:
    pool, tables = big_tables()
    full = count_full_checks(pool, monkeypatch)
    (b,) = pool.allocate("r0", 1)
    tables["r0"].append(b)
    pool._lru[b] = None
    with pytest.raises(BlockPoolError, match=f"block {b} is held by r0 and in the LRU list"):
        pool.check_tables(tables)
    assert full == []


def test_a_leak_is_caught_at_once(monkeypatch: Any) -> None:
    pool, tables = big_tables()
    full = count_full_checks(pool, monkeypatch)
    pool.allocate("r0", 1)  # held, but in no table
    with pytest.raises(BlockPoolError, match="a leak"):
        pool.check_tables(tables)
    assert full == []


@pytest.mark.parametrize("where", ["count", "middle"])
def test_an_entry_checked_before_is_caught_by_the_scheduled_whole_check(where: str) -> None:
    """A reference count changed behind an entry already checked (`count`), or an entry in
    the middle of a table rewritten in place (`middle`: its first and last checked blocks
    stay), is not new: the whole check finds it, at once when called, and within
    `steps_to_full` steps when the schedule calls it."""
    pool, tables = big_tables()
    pool.check_tables(tables)  # an incremental step first: the corruption is in old entries
    if where == "count":
        pool._owners[tables["r1"][PREFIX + 3]].append("r1")
        match = "reference count 2, in 1 tables"
    else:
        tables["r0"][40] = tables["r1"][40]
        match = f"r0's table has block {tables['r1'][40]}"
    with pytest.raises(BlockPoolError, match=match):
        pool.check_tables_full(tables)
    with pytest.raises(BlockPoolError, match=match):
        for _ in range(steps_to_full(tables)):
            pool.check_tables(tables)


@pytest.mark.parametrize("how", ["new_list", "first_changed", "last_changed", "shrunk"])
def test_a_replaced_table_is_checked_again_whole(how: str, monkeypatch: Any) -> None:
    """A table that is another list, or whose first or last checked block changed, or that
    is shorter than what was checked, is checked whole at the next step: here it ends up
    with another table's block below the length already checked, the totals unchanged."""
    pool, tables = big_tables()
    full = count_full_checks(pool, monkeypatch)
    theirs = tables["r1"]
    if how == "new_list":  # its first and last blocks the same, one in the middle not
        mine = list(tables["r0"])
        mine[40], theirs[40] = theirs[40], mine[40]
        tables["r0"] = mine
    elif how == "first_changed":  # in place, the last checked block unchanged
        mine = tables["r99"]
        mine[0], theirs[20] = theirs[20], mine[0]
    elif how == "last_changed":
        tables["r0"][-1], theirs[-1] = theirs[-1], tables["r0"][-1]
    else:  # r0 lets go of its last block, and swaps an entry with r1's table
        pool.free("r0", [tables["r0"].pop()])
        tables["r0"][40], theirs[40] = theirs[40], tables["r0"][40]
    with pytest.raises(BlockPoolError, match=r"r\d+'s table has block"):
        pool.check_tables(tables)
    assert full == []


# ---- in the engine -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tiny: Any) -> tuple[list[Any], dict[str, list[int]]]:
    model, tok = tiny
    wl = {
        "kind": "shared_prefix",
        "num_prefixes": 2,
        "questions_per_prefix": 4,
        "prefix_tokens": 40,
        "question_tokens": 7,
        "max_tokens": 6,
        "seed": 3,
    }
    specs = build_workload(wl, tok)
    refs = {s.id: hf_greedy(model, s.prompt_token_ids, 6, None) for s in specs}
    return specs, refs


@pytest.mark.parametrize(
    "over",
    [
        ("engine.max_num_seqs=1",),  # each request after the first of its prefix hits
        ("engine.max_num_seqs=3", "output=deferred", "window=4"),
        ("engine.max_num_seqs=2", "engine.num_blocks=16"),  # evicts and preempts
        ("engine.max_num_seqs=2", "scheduler=chunked", "scheduler.chunk_size=5"),
        ("engine.max_num_seqs=4", "engine.num_blocks=20", "output=deferred", "window=2"),
    ],
    ids=["one_row", "deferred4", "tight_pool", "chunked5", "tight_deferred2"],
)
def test_greedy_output_is_the_same_with_the_cache_on_and_off(
    tiny: Any, shared: Any, over: tuple[str, ...]
) -> None:
    model, tok = tiny
    specs, refs = shared
    runs = {}
    for alloc in ("incremental", "prefix_cache"):
        cfg = make_cfg("model=tiny", f"engine.block_size={BS}", f"allocator={alloc}", *over)
        res = run_engine(cfg, model, tok, specs)  # invariant checks on: refcounts every step
        runs[alloc] = (res, summarize(res))
        for seq in res.seqs:
            check_same_greedy(
                model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
            )
    (_, s_off), (_, s_on) = runs["incremental"], runs["prefix_cache"]
    prompts = sum(len(s.prompt_token_ids) for s in specs)
    assert s_on["prefix_query_tokens"] == prompts and s_off["prefix_query_tokens"] == 0
    assert s_on["prefix_hit_tokens"] > 0 and 0 < s_on["prefix_hit_rate"] < 1
    assert s_on["prefix_hit_tokens"] % BS == 0  # whole blocks only
    assert s_on["prefill_tokens"] < s_off["prefill_tokens"]
    if not s_on["preemptions"]:  # each prompt token either computed or found cached
        assert s_on["prefill_tokens"] + s_on["prefix_hit_tokens"] == prompts
    if "engine.num_blocks=16" in over:
        assert s_on["prefix_evictions"] > 0


def test_a_hit_never_covers_the_whole_prompt(tiny: Any) -> None:
    """The same prompt twice, one row at a time: the second finds all but its last block's
    worth cached, and computes at least its last token."""
    model, tok = tiny
    prompt = list(range(100, 116))  # 16 tokens: four full blocks
    from framework.core.request import RequestSpec, SamplingParams

    specs = [
        RequestSpec(f"r{i}", prompt, SamplingParams(max_tokens=3, ignore_eos=True))
        for i in range(2)
    ]
    cfg = make_cfg(
        "model=tiny", f"engine.block_size={BS}", "allocator=prefix_cache", "engine.max_num_seqs=1"
    )
    res = run_engine(cfg, model, tok, specs)
    s = summarize(res)
    assert s["prefix_hit_tokens"] == 12  # 3 of 4 blocks: (16 - 1) // 4
    assert res.seqs[0].output_token_ids == res.seqs[1].output_token_ids


def questions_on_one_prefix(n: int, max_tokens: int) -> list[Any]:
    """`n` prompts of 47 tokens: one 40-token prefix (ten full blocks) and 7 tokens each of
    their own, queued in order."""
    from framework.core.request import RequestSpec, SamplingParams

    prefix = list(range(100, 140))
    return [
        RequestSpec(
            f"q{i}",
            prefix + [200 + 10 * i + j for j in range(7)],
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        for i in range(n)
    ]


def test_the_step_budget_charges_only_what_is_not_cached(tiny: Any) -> None:
    """Three questions on a prefix the first request left cached: under a 56-token step
    budget (the least that admits a 47-token prompt with 4 tokens to generate) each is
    charged its 7 uncached tokens, not its 47-token prompt, so all three are admitted in
    one step beside the first request's decode (as vLLM's scheduler charges). Charged
    the whole prompt, only one would fit a step."""
    model, tok = tiny
    specs = questions_on_one_prefix(4, max_tokens=4)
    cfg = make_cfg(
        "model=tiny",
        f"engine.block_size={BS}",
        "allocator=prefix_cache",
        "engine.max_num_seqs=4",
        "engine.max_num_batched_tokens=56",
    )
    res = run_engine(cfg, model, tok, specs)  # invariant checks on: the budget every step
    admitted = [st.admitted for st in res.steps]
    assert admitted[:2] == [1, 3]
    assert res.steps[1].prefill_tokens == 3 * 7 and res.steps[1].decode_tokens == 1
    assert summarize(res)["prefix_hit_tokens"] == 3 * 40
    for seq in res.seqs:
        ref = hf_greedy(model, seq.spec.prompt_token_ids, 4, None)
        check_same_greedy(model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, ref)


def test_chunked_prefill_chunks_only_what_is_not_cached(tiny: Any) -> None:
    """Under `scheduler=chunked` a request that finds 40 of its 47 tokens cached is chunked
    over its 7 uncached ones: it takes one step, not ceil(47 / chunk) of them."""
    model, tok = tiny
    specs = questions_on_one_prefix(2, max_tokens=3)
    cfg = make_cfg(
        "model=tiny",
        f"engine.block_size={BS}",
        "allocator=prefix_cache",
        "scheduler=chunked",
        "scheduler.chunk_size=8",
        "engine.max_num_seqs=1",
    )
    res = run_engine(cfg, model, tok, specs)
    # q0: 47 tokens in chunks of 8 (6 steps, the last samples), then 2 decodes; q1: its 7
    # uncached tokens in one step, then 2 decodes.
    assert [st.prefill_tokens for st in res.steps] == [8, 8, 8, 8, 8, 7, 0, 0, 7, 0, 0]
    for seq in res.seqs:
        ref = hf_greedy(model, seq.spec.prompt_token_ids, 3, None)
        check_same_greedy(model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, ref)


# ---- scheduler=lpm -------------------------------------------------------------------------


def lpm(**over: Any) -> Any:
    from plugins.schedulers.lpm import LPMConfig, LPMScheduler

    return LPMScheduler(LPMConfig(name="lpm", **over))


class CachedRules:
    """The engine's side of a view as these tests need it: a table of cached tokens."""

    def __init__(self, cached: dict[str, int]) -> None:
        self.cached = cached

    def chunk(self, view: Any, seq: Any, budget: int) -> int:
        return int(seq.step_tokens)

    def cached_tokens(self, seq: Any) -> int:
        return self.cached[seq.id]

    def admits(self, view: Any, seq: Any, free_blocks: int) -> bool:
        return True


def lpm_view(cached: dict[str, int], now: float = 0.0, arrivals: dict[str, float] | None = None):  # type: ignore[no-untyped-def]
    from tests.test_plugins import make_seq, make_view

    arrivals = arrivals or {}
    waiting = tuple(make_seq(r, arrival=arrivals.get(r, 0.0)) for r in cached)
    view = make_view(waiting=waiting, now=now, max_num_seqs=2)
    return dataclasses.replace(view, rules=CachedRules(cached))


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    view = lpm_view({"cold": 0, "warm": 32, "warmest": 64})
    assert [s.id for s in lpm(aging_tokens_per_s=0.0).admit(view)] == ["warmest", "warm"]


def test_lpm_ages_waiting_requests_so_cold_ones_do_not_starve() -> None:
    # cold waited 2 s: at 64 tokens/s it ranks as 128 cached tokens, ahead of both.
    view = lpm_view(
        {"cold": 0, "warm": 32, "warmest": 64}, now=2.0, arrivals={"warm": 2.0, "warmest": 2.0}
    )
    assert [s.id for s in lpm().admit(view)] == ["cold", "warmest"]
    assert [s.id for s in lpm(aging_tokens_per_s=0.0).admit(view)] == ["warmest", "warm"]


def test_lpm_falls_back_to_fcfs_past_its_queue_limit() -> None:
    view = lpm_view({"cold": 0, "warm": 32, "warmest": 64})
    assert [s.id for s in lpm(max_queue=2).admit(view)] == ["cold", "warm"]


def test_lpm_options_are_checked(capsys: Any) -> None:
    from tests.helpers import assert_refused, cli

    status, _, err = cli(capsys, "model=tiny", "scheduler=lpm", "scheduler.max_queue=-1")
    assert_refused(status, err, "scheduler.max_queue must be >= 0, got -1")


def test_lpm_with_the_cache_hits_more_and_serves_the_same_tokens(tiny: Any, shared: Any) -> None:
    """Interleaved prefixes through a pool too small to keep them all: FCFS evicts a prefix
    before its next question comes, lpm runs each prefix's questions while it is cached."""
    model, tok = tiny
    specs, refs = shared
    got = {}
    for sched in ("continuous", "lpm"):
        cfg = make_cfg(
            "model=tiny",
            f"engine.block_size={BS}",
            "allocator=prefix_cache",
            f"scheduler={sched}",
            "engine.max_num_seqs=2",
            "engine.num_blocks=16",
        )
        res = run_engine(cfg, model, tok, specs)
        got[sched] = summarize(res)
        for seq in res.seqs:
            check_same_greedy(
                model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
            )
    assert got["lpm"]["prefix_hit_rate"] > got["continuous"]["prefix_hit_rate"]
    assert got["lpm"]["prefill_tokens"] < got["continuous"]["prefill_tokens"]


def test_without_a_cache_the_view_reports_nothing_cached() -> None:
    from tests.test_plugins import make_seq, make_view

    assert make_view().cached_tokens(make_seq("r0")) == 0


# ---- an allocator that declines: the watermark ---------------------------------------------


def test_a_watermark_keeps_blocks_free_and_the_engine_enforces_a_decline(tiny: Any) -> None:
    """allocator.watermark (vLLM's): admission keeps a share of the pool free. With it, the
    tight pool preempts less; a scheduler that admits past the allocator's veto is stopped."""
    from framework.api import PolicyError
    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine

    model, tok = tiny
    wl = {"kind": "fixed", "prompt_lens": [8] * 6, "output_lens": [24] * 6, "seed": 0}
    specs = build_workload(wl, tok)
    base = ("model=tiny", f"engine.block_size={BS}", "engine.num_blocks=24")
    plain = summarize(run_engine(make_cfg(*base), model, tok, specs))
    kept = summarize(run_engine(make_cfg(*base, "allocator.watermark=0.7"), model, tok, specs))
    assert plain["preemptions"] == 3 and kept["preemptions"] == 0  # at 0.7, 17 blocks kept free

    from plugins.schedulers.continuous import ContinuousScheduler

    class AdmitsAll(ContinuousScheduler):
        """Ignores the allocator's veto: as many as there are rows."""

        def admit(self, view):  # type: ignore[no-untyped-def]
            return list(view.waiting)[: view.max_num_seqs]

    engine = build_engine(
        make_cfg(*base, "allocator.watermark=0.5"),
        model,
        torch.device("cpu"),
        torch.float32,
        registry().pm.hook,
    )
    engine.p.use("scheduler", AdmitsAll(engine.p.scheduler.cfg))
    with pytest.raises(PolicyError, match="which the allocator declines"):
        engine.run(specs, tok.eos_token_id)


def test_the_watermark_is_checked(capsys: Any) -> None:
    from tests.helpers import assert_refused, cli

    status, _, err = cli(capsys, "model=tiny", "allocator.watermark=1.5")
    assert_refused(status, err, "allocator.watermark must be in [0, 1), got 1.5")


# ---- an eviction order of one's own --------------------------------------------------------


def test_an_allocator_chooses_its_own_eviction_order() -> None:
    """The pool asks `choose` which cached block goes; here the shallowest (a prompt's head
    first, the opposite of the default), and a choice that is not cached is refused."""
    from framework.api import CachedBlock

    seen: list[list[CachedBlock]] = []

    def head_first(cached: list[CachedBlock]) -> int:
        seen.append(cached)
        return min(cached, key=lambda c: c.depth).block

    pool = PrefixCachingPool(4, BS, choose=head_first)
    a = published(pool, "a", list(range(16)))
    pool.free("a", a)
    (got,) = pool.allocate("b", 1)
    assert got == a[0] and pool.evictions == 1
    assert [c.depth for c in seen[0]] == [3, 2, 1, 0]  # least recently freed first: the tail
    assert pool.match(list(range(16)), 4) == []  # the head is gone, so nothing chains
    pool.check()
    bad = PrefixCachingPool(2, BS, choose=lambda cached: 99)
    pool_a = published(bad, "a", list(range(8)))
    bad.free("a", pool_a)
    with pytest.raises(BlockPoolError, match="chose block 99"):
        bad.allocate("b", 1)


def test_an_allocators_eviction_order_runs_in_the_engine(tiny: Any, shared: Any) -> None:
    """A third-party allocator with `choose_eviction` (most recently freed first): the pool
    uses it, and the answers are the same tokens."""
    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine
    from plugins.allocators.prefix_cache import PrefixCacheAllocator

    model, tok = tiny
    specs, refs = shared
    calls = []

    class MostRecentFirst(PrefixCacheAllocator):
        def choose_eviction(self, cached):  # type: ignore[no-untyped-def]
            calls.append(len(cached))
            return max(cached, key=lambda c: c.freed).block

    import framework.run.app as app

    cfg = make_cfg(
        "model=tiny", f"engine.block_size={BS}", "allocator=prefix_cache",
        "engine.max_num_seqs=2", "engine.num_blocks=16",
    )  # fmt: skip
    original = app.build_policies

    def with_ours(c):  # type: ignore[no-untyped-def]
        p = original(c)
        p.allocator = MostRecentFirst(p.allocator.cfg)
        return p

    app.build_policies = with_ours
    try:
        engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    finally:
        app.build_policies = original
    res = engine.run(specs, tok.eos_token_id)
    assert calls and summarize(res)["prefix_evictions"] == len(calls)
    for seq in res.seqs:
        check_same_greedy(
            model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
        )
