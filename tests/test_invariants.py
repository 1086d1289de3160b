"""The checks must catch the bugs they exist for, and a misbehaving policy must be named."""

from __future__ import annotations

import dataclasses

import pytest

from framework.api.policy import EngineView, OutputView, PolicyError, Scheduler
from framework.core.request import RequestSpec, SamplingParams
from framework.engine.block_pool import BlockPool, BlockPoolError
from framework.engine.invariants import InvariantError, check_end
from framework.engine.view_factory import make_frozen
from framework.executors.simulated.cost import StepCost
from framework.executors.simulated.features import StepFeatures
from framework.run.summary import summarize
from tests.helpers import make_cfg, run_engine


def specs(n: int = 3) -> list[RequestSpec]:
    return [
        RequestSpec(f"r{i}", [10 + i, 11, 12], SamplingParams(max_tokens=5, ignore_eos=True))
        for i in range(n)
    ]


def test_pool_refuses_double_ownership_and_foreign_frees() -> None:
    pool = BlockPool(4, 16)
    a = pool.allocate("a", 2)
    with pytest.raises(BlockPoolError, match="owned by a"):
        pool.free("b", a)
    with pytest.raises(BlockPoolError, match="only 2 free"):
        pool.allocate("c", 3)
    pool.free("a", a)
    pool.check()
    assert pool.num_free == 4 and pool.peak_used == 2


def test_end_check_catches_a_leaked_block(tiny) -> None:
    model, tok = tiny
    res = run_engine(make_cfg("model=tiny"), model, tok, specs())
    from framework.engine.counters import Counters

    n = summarize(res)["tokens_kept"]
    counters = Counters(tokens_kept=n, deferred_tokens=n)
    pool = BlockPool(8, 16)
    check_end(res.seqs, pool, counters, [])  # balanced books pass
    pool.allocate("r1", 1)  # a block nobody returned
    with pytest.raises(InvariantError, match="1 KV blocks leaked"):
        check_end(res.seqs, pool, counters, [])
    with pytest.raises(InvariantError, match="engine kept"):
        check_end(res.seqs, BlockPool(8, 16), Counters(tokens_kept=1, deferred_tokens=1), [])


def test_step_check_catches_blocks_held_outside_the_batch(tiny) -> None:
    model, tok = tiny
    import torch

    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine

    engine = build_engine(
        make_cfg("model=tiny"), model, torch.device("cpu"), torch.float32, registry().pm.hook
    )
    engine.pool.allocate("ghost", 1)
    with pytest.raises(InvariantError, match="running rows hold"):
        engine.run(specs(), tok.eos_token_id)


class GreedyBadScheduler(Scheduler):
    """Admits more rows than allowed: the engine must stop it and name it."""

    def evict(self, view):  # type: ignore[no-untyped-def]
        return [s for s in view.running if s.finished]

    def admit(self, view):  # type: ignore[no-untyped-def]
        return list(view.waiting)


def test_policy_that_breaks_the_contract_is_named(tiny) -> None:
    model, tok = tiny
    import torch

    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine

    engine = build_engine(
        make_cfg("model=tiny", "engine.max_num_seqs=2"),
        model,
        torch.device("cpu"),
        torch.float32,
        registry().pm.hook,
    )
    engine.p.use("scheduler", GreedyBadScheduler(engine.p.scheduler.cfg))
    with pytest.raises(
        PolicyError, match=r"scheduler policy 'continuous'.*exceeds engine.max_num_seqs"
    ):
        engine.run(specs(3), tok.eos_token_id)


def test_slots_map_every_position_to_its_block() -> None:
    """`batch_build.slots` (a per-block loop for short spans, one numpy sum for long ones)
    against the plain per-position mapping, and a short table is an IndexError."""
    import random

    from framework.engine.batch_build import slots

    rng = random.Random(3)
    for bs in (1, 4, 16):
        for _ in range(200):
            table = rng.sample(range(1000), rng.randint(1, 40))
            end = rng.randint(1, len(table) * bs)
            start = rng.randint(0, end - 1)
            want = [table[p // bs] * bs + p % bs for p in range(start, end)]
            assert slots(table, start, end, bs) == want
        with pytest.raises(IndexError):
            slots([7] * 5, 0, 5 * bs + 1, bs)


def _every_field(cls: type) -> dict[str, object]:
    """A value for each field of a dataclass (distinct, so a swapped field shows)."""
    return {f.name: (i, f.name) for i, f in enumerate(dataclasses.fields(cls))}


@pytest.mark.parametrize("cls", [EngineView, OutputView, StepFeatures, StepCost])
def test_a_frozen_class_made_without_its_init_is_the_one_init_makes(cls: type) -> None:
    """`make_frozen` (the engine's views, a step's features and cost: several a step) fills
    the instance's dict at once; equal to `cls(**fields)`, with the same attributes, still
    frozen, and only for classes with no `__post_init__` to skip."""
    fields = _every_field(cls)
    made, init = make_frozen(cls, **fields), cls(**fields)
    assert made == init and vars(made) == vars(init) and hash(made) == hash(init)
    assert not hasattr(cls, "__post_init__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.step = 0  # type: ignore[attr-defined]


def test_the_engine_gives_every_view_each_of_its_fields(tiny) -> None:
    """The engine's views set every field themselves (none left to a class default), so a
    field added to `EngineView` or `OutputView` must be added where the engine makes them."""
    import torch

    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine

    model, tok = tiny
    engine = build_engine(
        make_cfg("model=tiny"), model, torch.device("cpu"), torch.float32, registry().pm.hook
    )
    seen: list[object] = []
    real_view, real_output_view = engine.planner.view, engine.held.view
    engine.planner.view = lambda *a, **k: seen.append(real_view(*a, **k)) or seen[-1]  # type: ignore[method-assign]
    engine.held.view = lambda *a: seen.append(real_output_view(*a)) or seen[-1]  # type: ignore[method-assign]
    engine.run(specs(), tok.eos_token_id)
    kinds = {type(v) for v in seen}
    assert kinds == {EngineView, OutputView}
    for v in seen:
        assert set(vars(v)) >= {f.name for f in dataclasses.fields(v)}  # type: ignore[arg-type]


class Displacing(GreedyBadScheduler):
    def displace(self, view):  # type: ignore[no-untyped-def]
        return []


def displaces(scheduler: object) -> bool:
    from framework.api.policy import Scheduler, overrides

    return overrides(scheduler, Scheduler, "displace")


def test_only_a_scheduler_with_its_own_displace_is_asked() -> None:
    """The default `displace` names no one: the engine skips the call and its view."""
    from framework.plugin_host.guard import Guarded

    assert not displaces(GreedyBadScheduler(None))  # type: ignore[arg-type]
    assert displaces(Displacing(None))  # type: ignore[arg-type]
    assert not displaces(Guarded(GreedyBadScheduler(None), "scheduler", "x", None))  # type: ignore[arg-type]
    assert displaces(Guarded(Displacing(None), "scheduler", "x", None))  # type: ignore[arg-type]
    assert displaces(object())  # not a Scheduler: asked, and fails as it would
