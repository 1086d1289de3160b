"""vLLM's first scheduler (`scheduler=prefill_first`) and the `Scheduler.pause` hook it uses:
a step that admits runs its prefills alone while every decode row waits; greedy tokens are
those of any other schedule; a pause that breaks the contract is stopped by name."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import torch

from framework.api import EngineView, PolicyError, Sequence
from framework.plugin_host.registry import registry
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


def test_decode_steps_look_at_the_queue_once_a_run(tiny: Any) -> None:
    """`scheduler.decode_steps=k` (vLLM's multi-step scheduling): after a step that admits
    nothing, k decode steps run before the next admission; tokens are unchanged."""
    model, tok = tiny
    specs = random_specs(tok, 20, seed=6, prompt=(3, 30), output=(3, 20))  # all at t=0: the
    # queue never empties before the last admission, so no run ends for want of rows
    every = run_engine(make_cfg(*BASE, "scheduler=prefill_first"), model, tok, specs)
    k = 4
    runs = run_engine(
        make_cfg(*BASE, "scheduler=prefill_first", f"scheduler.decode_steps={k}"), model, tok, specs
    )
    assert tokens(runs) == tokens(every)
    assert summarize(runs)["requests_finished"] == len(specs)
    admits = [i for i, st in enumerate(runs.steps) if st.admitted]
    assert len(admits) < len([st for st in every.steps if st.admitted])
    for before, after in pairwise(admits):
        decodes = after - before - 1  # decode steps between two admitting steps
        assert decodes == 0 or decodes >= k, (before, after)


def test_decode_steps_below_one_is_refused(capsys: Any, tmp_path: Any) -> None:
    from tests.helpers import assert_refused, cli

    status, _, err = cli(
        capsys, *BASE, "scheduler=prefill_first", "scheduler.decode_steps=0",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert_refused(status, err, "scheduler.decode_steps must be >= 1")


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
    engine.p.use("scheduler", cls(engine.p.scheduler.cfg))
    with pytest.raises(PolicyError, match=expected):
        engine.run(staggered(tok), tok.eos_token_id)
