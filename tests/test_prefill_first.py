"""vLLM's first scheduler (`scheduler=prefill_first`) and the `Scheduler.pause` hook it uses:
a step that admits runs its prefills alone while every decode row waits; greedy tokens are
those of any other schedule; a pause that breaks the contract is stopped by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from framework.api import EngineView, PolicyError, Sequence
from framework.api.registry import registry
from framework.run.app import build_engine
from framework.run.summary import summarize
from plugins.schedulers.continuous import ContinuousScheduler
from tests.helpers import make_cfg, random_specs, run_engine, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ("model=tiny", "engine.block_size=4", "engine.max_num_seqs=8")


def staggered(tok: Any) -> list[Any]:
    specs = random_specs(tok, 12, seed=5, prompt=(3, 30), output=(3, 20))
    for i, s in enumerate(specs):  # arrivals spread over the decodes of the earlier ones
        s.arrival = 0.002 * i
    return specs


def test_prefills_run_alone_and_tokens_match_continuous(tiny: Any) -> None:
    model, tok = tiny
    specs = staggered(tok)
    mixed = run_engine(make_cfg(*BASE, "scheduler=continuous"), model, tok, specs)
    first = run_engine(make_cfg(*BASE, "scheduler=prefill_first"), model, tok, specs)
    assert tokens(first) == tokens(mixed)
    assert summarize(first)["requests_finished"] == len(specs)
    admitting = [st for st in first.steps if st.admitted]
    assert admitting and all(st.decode_rows == 0 for st in admitting)
    assert all(st.rows == st.admitted for st in admitting)  # the new prompts alone
    # continuous mixes them: some step admits beside decode rows
    assert any(st.admitted and st.decode_rows for st in mixed.steps)


class PausesAnAdmission(ContinuousScheduler):
    def pause(self, view: EngineView, admitted: list[Sequence]) -> list[Sequence]:
        return list(admitted)


class PausesEveryRow(ContinuousScheduler):
    def pause(self, view: EngineView, admitted: list[Sequence]) -> list[Sequence]:
        return [] if admitted else list(view.running)  # a decode step with no row left


@pytest.mark.parametrize(
    ("cls", "expected"),
    [(PausesAnAdmission, "not a running row admitted before"), (PausesEveryRow, "paused all")],
)
def test_a_pause_that_breaks_the_contract_is_named(tiny: Any, cls: type, expected: str) -> None:
    model, tok = tiny
    engine = build_engine(
        make_cfg(*BASE), model, torch.device("cpu"), torch.float32, registry().pm.hook
    )
    engine.p.scheduler = cls(engine.p.scheduler.cfg)
    with pytest.raises(PolicyError, match=expected):
        engine.run(staggered(tok), tok.eos_token_id)
