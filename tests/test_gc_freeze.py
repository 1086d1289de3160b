"""What keeps the garbage collector's work small in a long run: the run's long-lived objects
frozen out of its full passes, and engine views freed the moment they are dropped."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.gc_freeze import frozen_heap
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from tests.helpers import make_cfg


def test_frozen_for_the_run_and_handed_back() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap() as freeze:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        made = [[i] for i in range(1000)]  # made after: not frozen until asked
        freeze()
        assert gc.get_freeze_count() >= frozen + len(made)
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("a run that fails hands the heap back too")
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_someone_else_stays_frozen() -> None:
    gc.freeze()
    try:
        # Only gc.freeze() adds to the count, and only gc.unfreeze() empties it; a frozen
        # object that dies meanwhile (another thread's, another test's) takes one off it.
        before = gc.get_freeze_count()
        with frozen_heap() as freeze:
            freeze()  # not ours: a no-op
            assert 0 < gc.get_freeze_count() <= before
        assert 0 < gc.get_freeze_count() <= before  # still frozen: not handed back by us
    finally:
        gc.unfreeze()


def test_the_run_unfreezes_and_views_hold_no_cycle(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    cfg = make_cfg("model=tiny", "scheduler=continuous", "allocator=incremental")
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    specs = [
        RequestSpec(f"r{i}", [5, 6, 7, 8][: i + 1], SamplingParams(max_tokens=3, ignore_eos=True))
        for i in range(3)
    ]
    result = engine.run(specs, tok.eos_token_id)
    assert all(s.finish_reason == "length" for s in result.seqs)
    assert gc.get_freeze_count() == 0
    gc.disable()  # only reference counting may free the view
    try:
        view = engine.planner.view(planned=0)
        ref = weakref.ref(view)
        seq = result.seqs[0]
        # Its rules are the engine's answers: the allocator's veto (incremental declines
        # nothing) and price, no prefix cache, and a finished row's one token.
        assert view.admits(seq, 1) is True
        price = engine.p.allocator.blocks_to_admit(seq, engine.pool.block_size)
        assert view.blocks_to_admit(seq) == price == 1
        assert view.cached_tokens(seq) == 0
        assert view.chunk(seq, 100) == seq.step_tokens == 1
        del view
        assert ref() is None, "an engine view is kept alive by a reference cycle"
    finally:
        gc.enable()


def test_an_engine_is_freed_by_reference_counting(tiny: tuple[Any, Any]) -> None:
    """Nothing an engine holds refers back to it: dropping the last reference frees it and
    its KV cache at once. A cycle would keep every engine of a long test or sweep alive
    until the collector's next full pass, their caches with them."""
    model, tok = tiny
    cfg = make_cfg("model=tiny", "output=deferred", "window=2")
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    spec = RequestSpec("r0", [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.run([spec], tok.eos_token_id)
    gc.disable()
    try:
        ref = weakref.ref(engine)
        del engine
        assert ref() is None, "an engine is kept alive by a reference cycle"
    finally:
        gc.enable()
