"""KV laid out in contiguous extents (`engine.kv_layout=contiguous`), Orca's reservation rules
(`allocator=worst_case allocator.reserve=oracle|pow2|max`) and the KV memory shares.

The buddy allocator, over hypothesis-drawn admissions and releases: no unit doubly owned,
free buddies coalesced, the pool conserved, and back to one piece when all is freed. The
engine on the tiny model: greedy tokens equal under every layout and rule (a reservation
changes only who waits); the reservation rules order the batch sizes as the vLLM paper's
Fig. 13 does; external fragmentation appears under extents and never under pages."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from framework.engine.block_pool import BlockPoolError
from framework.engine.buddy import BuddyError, BuddyExtents
from framework.engine.contiguous_pool import ContiguousPool
from framework.run.kv_shares import KV_SHARES
from framework.run.summary import summarize
from framework.studies.notebook import run
from plugins.allocators.worst_case import WorstCaseAllocator, WorstCaseConfig
from tests.helpers import assert_refused, cli, make_cfg, random_specs, run_engine, tokens

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the buddy allocator ------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    units=st.integers(1, 300),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 120), st.integers(0, 10**6)), max_size=60),
)
def test_buddy_conserves_units_and_coalesces(units: int, ops: list[tuple[bool, int, int]]) -> None:
    b = BuddyExtents(units)
    held: dict[int, int] = {}
    for alloc, n, pick in ops:
        if alloc or not held:
            fits = b.fits(n)
            assert fits == (n <= b.largest_free())
            if not fits:
                with pytest.raises(BuddyError):
                    b.allocate(n)
                continue
            start = b.allocate(n)
            assert start not in held and start >= 0 and start + n <= units
            for s, m in held.items():  # no unit doubly owned
                assert start + n <= s or s + m <= start
            held[start] = n
        else:
            start = sorted(held)[pick % len(held)]
            assert b.free(start) == held.pop(start)
        b.check()  # every unit free or held exactly once; free buddies coalesced
        assert b.num_free + sum(held.values()) == units
    for start in list(held):
        b.free(start)
    b.check()
    # all free again: the pieces are the range's own decomposition, nothing left split
    assert b.num_free == units and b.largest_free() == 1 << (units.bit_length() - 1)


def test_buddy_extents_are_exact_and_holes_are_external() -> None:
    b = BuddyExtents(16)
    a = b.allocate(5)  # exactly 5 units; the tail of its piece of 8 goes back
    assert b.num_free == 11
    b.free(a)
    assert b.fits(16)  # coalesced whole again
    quarters = [b.allocate(4) for _ in range(4)]
    b.free(quarters[0])
    b.free(quarters[2])
    # 8 units free in two holes of 4: no extent of 8 fits, 4 units are external
    assert b.num_free == 8 and not b.fits(8) and b.largest_free() == 4
    with pytest.raises(BuddyError, match="starts no extent"):
        b.free(3)
    # a copy (a trial placement's scratch) changes apart from the original
    twin = b.copy()
    twin.allocate(4)
    twin.free(quarters[1])
    assert b.num_free == 8 and b.extents() == {4: 4, 12: 4}
    assert twin.num_free == 8 and twin.extents() == {0: 4, 12: 4}
    b.check()
    twin.check()


def test_contiguous_pool_owns_extents_and_refuses_growth() -> None:
    pool = ContiguousPool(32, 4)
    blocks = pool.allocate("r0", 5)
    assert blocks == list(range(blocks[0], blocks[0] + 5))
    with pytest.raises(BlockPoolError, match="cannot grow"):
        pool.allocate("r0", 1)
    with pytest.raises(BlockPoolError, match="not the extent"):
        pool.free("r1", blocks)
    pool.check_tables({"r0": blocks})
    pool.free("r0", blocks)
    pool.check()
    assert pool.num_free == 32 and pool.external_free() == 0


def test_would_place_takes_back_trials_the_scheduler_did_not_admit() -> None:
    pool = ContiguousPool(16, 1)
    pool.allocate("held", 4)  # [0, 4): 12 free as pieces of 4 and 8
    pool.forget_trials()
    assert pool.would_place(8, pool.num_free)  # trial: the piece of 8
    # not admitted after all (the free count did not move): the trial is taken back
    assert pool.would_place(8, pool.num_free)
    # admitted (8 taken): the next 8 cannot be placed in the 4 left
    assert not pool.would_place(8, pool.num_free - 8)
    assert pool.would_place(4, pool.num_free - 8)
    assert pool.can_place([8, 4]) and not pool.can_place([4, 8, 4])


# ---- the reservation rules ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("reserve", "max_len", "expected"),
    [("oracle", None, 25), ("pow2", None, 32), ("max", None, 2048), ("max", 100, 100)],
)
def test_reservation_rules(reserve: str, max_len: int | None, expected: int) -> None:
    from framework.core.request import RequestSpec, SamplingParams
    from framework.core.sequence import Sequence

    alloc = WorstCaseAllocator(WorstCaseConfig(reserve=reserve, max_len=max_len))
    alloc.max_model_len = 2048
    seq = Sequence(RequestSpec("r", [5] * 20, SamplingParams(max_tokens=5, ignore_eos=True)), None)
    assert alloc.reservation(seq) == expected
    assert alloc.blocks_to_admit(seq, 16) == -(-expected // 16)
    long = Sequence(RequestSpec("l", [5] * 150, SamplingParams(max_tokens=5)), None)
    assert alloc.reservation(long) >= long.max_len  # never less than the request's own


# ---- the engine ---------------------------------------------------------------------------
SYSTEMS = {  # the vLLM paper's four, on the tiny model
    "orca_max": ("allocator=worst_case", "allocator.reserve=max", "engine.kv_layout=contiguous"),
    "orca_pow2": ("allocator=worst_case", "allocator.reserve=pow2", "engine.kv_layout=contiguous"),
    "orca_oracle": (
        "allocator=worst_case",
        "allocator.reserve=oracle",
        "engine.kv_layout=contiguous",
    ),
    "vllm": ("allocator=incremental",),
}


BASE = (
    "model=tiny",
    "model.max_model_len=128",
    "engine.block_size=1",
    "engine.num_blocks=300",
    "engine.max_num_seqs=64",
    "engine.max_num_batched_tokens=512",
)


def test_layouts_and_rules_give_the_same_greedy_tokens(tiny: Any) -> None:
    model, tok = tiny
    specs = random_specs(tok, 10, seed=3, prompt=(2, 20), output=(4, 16))
    ref = tokens(run_engine(make_cfg(*BASE, *SYSTEMS["vllm"]), model, tok, specs))
    for name in ("orca_max", "orca_pow2", "orca_oracle"):
        assert tokens(run_engine(make_cfg(*BASE, *SYSTEMS[name]), model, tok, specs)) == ref, name


def simulate(tmp: Any, *overrides: str) -> tuple[dict[str, Any], Any]:
    """A simulated run's metrics and its steps."""
    out = run(["executor=simulated", "observers=[]", *overrides], out=tmp)
    return out.metrics, out.steps


def test_reservation_rules_order_the_batch_and_the_memory_shares(tmp_path: Any) -> None:
    """On the simulated executor (the same engine; counts as the model's): Orca(Max) <=
    Pow2 <= Oracle <= vLLM in batched requests, external fragmentation under extents only."""
    workload = (
        "workload=synthetic",
        "workload.num_requests=40",
        "workload.arrival=burst",
        "workload.prompt_len_mean=12",
        "workload.prompt_len_min=2",
        "workload.prompt_len_max=20",
        "workload.output_len_mean=16",
        "workload.output_len_max=30",
    )
    rows = {}
    for name, extra in SYSTEMS.items():
        s, steps = simulate(tmp_path / name, *BASE, *workload, *extra)
        assert s["requests_finished"] == 40
        rows[name] = s["mean_rows"]
        shares = [s[f"kv_share_{k}"] for k in KV_SHARES]
        assert all(0 <= x <= 1 for x in shares) and sum(shares) == pytest.approx(1.0)
        if name == "vllm":
            assert s["kv_share_external"] == 0 and s["kv_share_reserved"] < 0.05
        else:
            assert s["kv_share_external"] > 0  # holes between extents
        if name == "orca_oracle":
            assert s["kv_share_internal"] == 0  # it books exactly what the request uses
        if name == "orca_max":
            assert s["kv_share_internal"] > s["kv_share_states"]
            assert steps["rows"].max() <= 300 // 128  # 2 extents of 128
    assert rows["orca_max"] <= rows["orca_pow2"] <= rows["orca_oracle"] <= rows["vllm"]
    assert rows["orca_max"] < rows["vllm"]


def test_a_reservation_no_extent_can_hold_is_rejected_up_front(tiny: Any) -> None:
    model, tok = tiny
    specs = random_specs(tok, 3, seed=1, prompt=(2, 8), output=(2, 4))
    cfg = make_cfg(
        "model=tiny",
        "model.max_model_len=256",
        "engine.block_size=1",
        "engine.num_blocks=200",  # largest piece 128 < a max reservation of 256
        *SYSTEMS["orca_max"],
    )
    res = run_engine(cfg, model, tok, specs)
    s = summarize(res)
    assert s["requests_rejected"] == 3


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("engine.kv_layout=stacked",), "engine.kv_layout must be one of paged, contiguous"),
        (("engine.kv_layout=contiguous",), "it takes allocator=worst_case"),
        (("allocator=worst_case", "allocator.reserve=some"), "allocator.reserve must be one of"),
        (("allocator=worst_case", "allocator.max_len=0"), "allocator.max_len must be a positive"),
    ],
)
def test_bad_layout_and_reserve_settings_are_one_line(
    capsys: Any, args: tuple[str, ...], expected: str
) -> None:
    status, _, err = cli(capsys, "model=tiny", "executor=simulated", "observers=[]", *args)
    assert_refused(status, err, expected)
