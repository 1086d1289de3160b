"""Chunked prefill (`scheduler=chunked`, `Scheduler.chunk`): a prompt computed a chunk per
step beside the decodes. Greedy output equals Hugging Face `generate` for chunk sizes 1, 7,
one block and unlimited, with prompts longer than the token budget, preemption (a chunked
recompute) and deferred output; a chunk short of its prompt's end samples nothing; the counts
add up; a chunk rule that breaks the contract is stopped by name."""

from __future__ import annotations

import csv
import itertools
import json
from typing import Any

import pytest
import torch

from framework.api import EngineView, PolicyError, Scheduler, Sequence, chunk_prefill
from framework.core.request import RequestSpec, SamplingParams
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from framework.run.summary import summarize
from plugins.schedulers.sjf import SJFScheduler
from tests.helpers import assert_refused, check_same_greedy, cli, hf_greedy, make_cfg, run_engine

CHUNKS = ("1", "7", "16", "null")  # one token, an odd size, one block, the budget only
LENGTHS = [(45, 6), (3, 12), (30, 4), (61, 8), (9, 10), (17, 5)]  # (prompt, max_tokens)

pytestmark = pytest.mark.usefixtures("one_thread")


def make_specs(vocab: int, lengths: list[tuple[int, int]], **sampling: Any) -> list[RequestSpec]:
    g = torch.Generator().manual_seed(7)
    return [
        RequestSpec(
            f"r{i}",
            torch.randint(3, vocab - 1, (n,), generator=g).tolist(),
            SamplingParams(max_tokens=m, ignore_eos=True, seed=i, **sampling),
        )
        for i, (n, m) in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def reference(tiny: Any) -> tuple[list[RequestSpec], dict[str, list[int]]]:
    model, tok = tiny
    specs = make_specs(len(tok), LENGTHS)
    refs = {s.id: hf_greedy(model, s.prompt_token_ids, s.sampling.max_tokens, None) for s in specs}
    return specs, refs


def check_all(model: Any, res: Any, refs: dict[str, list[int]]) -> None:
    assert all(s.finish_reason == "length" for s in res.seqs)
    for seq in res.seqs:
        check_same_greedy(
            model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
        )


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("output=deferred", "window=4"),
        ("allocator=worst_case",),
        # A pool that preempts: 21 blocks of 4 tokens, 18 of them for the longest request.
        ("engine.num_blocks=21", "output=deferred", "window=3"),
    ],
    ids=["immediate", "deferred4", "worst_case", "tight_pool_deferred3"],
)
def test_greedy_matches_hf_generate_with_prompts_over_the_budget(
    tiny: Any, reference: Any, chunk: str, extra: tuple[str, ...]
) -> None:
    model, tok = tiny
    specs, refs = reference
    cfg = make_cfg(
        "model=tiny",
        "scheduler=chunked",
        f"scheduler.chunk_size={chunk}",
        "engine.block_size=4",
        "engine.max_num_seqs=4",
        "engine.max_num_batched_tokens=24",  # below 4 of the 6 requests' prompt + output
        *extra,
    )
    res = run_engine(cfg, model, tok, specs)
    check_all(model, res, refs)
    s = summarize(res)
    assert s["requests_rejected"] == 0
    assert max(st.prefill_tokens + st.decode_tokens for st in res.steps) <= 24
    if not s["preemptions"]:  # each prompt token computed once, in its chunks
        assert s["prefill_tokens"] == sum(len(p.prompt_token_ids) for p in specs)
    # Every piece is at most the chunk size and the step's budget, and at least one token:
    # a prompt takes at least ceil(prompt / min(chunk, budget)) pieces (more when a step's
    # decodes leave less room, or when a preempted request is prefilled again), and there
    # are at most as many pieces as tokens prefilled.
    cap = 24 if chunk == "null" else min(int(chunk), 24)
    fewest = sum(-(-len(p.prompt_token_ids) // cap) for p in specs)
    assert fewest <= s["prefill_chunks"] <= s["prefill_tokens"]
    assert s["prefill_chunks"] == sum(st.prefill_rows for st in res.steps)
    if chunk == "1":
        assert s["prefill_chunks"] == s["prefill_tokens"]
    if "engine.num_blocks=21" in extra:
        assert s["preemptions"] > 0 and s["recomputed_tokens"] > 0
    if "output=deferred" in extra:
        assert s["transfers"] < s["steps"]


def test_unchunked_schedulers_still_refuse_a_request_over_the_budget(tiny: Any) -> None:
    model, tok = tiny
    specs = make_specs(len(tok), [(40, 4), (5, 4)])
    res = run_engine(
        make_cfg("model=tiny", "engine.max_num_batched_tokens=24", "engine.max_num_seqs=4"),
        model,
        tok,
        specs,
    )
    status = {s.id: s.status.value for s in res.seqs}
    assert status == {"r0": "rejected", "r1": "released"}
    assert "max_num_batched_tokens" in (res.seqs[0].reject_reason or "")


class Spy:
    """The real executor, every batch kept."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[Any] = []

    def execute(self, batch: Any) -> Any:
        self.batches.append(batch)
        return self.inner.execute(batch)

    def describe(self) -> dict[str, str]:
        return self.inner.describe()


def test_a_chunk_short_of_its_end_samples_nothing(tiny: Any) -> None:
    """Sampled requests (seeded draws): the same tokens chunked and not, and the rows that
    stop short of their prompt's end are marked to sample nothing and deliver nothing."""
    model, tok = tiny
    specs = make_specs(len(tok), [(30, 6), (12, 6)], temperature=0.8, top_p=0.9)
    whole = run_engine(make_cfg("model=tiny"), model, tok, specs)
    engine = build_engine(
        make_cfg("model=tiny", "scheduler=chunked", "scheduler.chunk_size=8"),
        model,
        torch.device("cpu"),
        torch.float32,
        registry().pm.hook,
    )
    spy = Spy(engine.executor)
    engine.executor = spy
    res = engine.run(specs, tok.eos_token_id)
    assert {s.id: s.output_token_ids for s in res.seqs} == {
        s.id: s.output_token_ids for s in whole.seqs
    }
    partial = [(r.seq_id, r.start_pos) for b in spy.batches for r in b.rows if not r.samples]
    # r0: chunks at 0, 8, 16 sample nothing, 24..29 samples; r1: 0 nothing, 8..11 samples.
    assert partial == [("r0", 0), ("r1", 0), ("r0", 8), ("r0", 16)]
    steps = res.steps
    assert sum(st.partial_rows for st in steps) == 4
    assert summarize(res)["token_slots"] == summarize(whole)["token_slots"]
    first = [st.tokens_kept for st in steps[:3]]
    assert first == [0, 1, 1]  # nothing delivered until a prompt's last chunk


def test_steps_csv_has_each_steps_prefill_and_decode_tokens(capsys: Any, tmp_path: Any) -> None:
    status, _out, err = cli(
        capsys,
        "model=tiny",
        "scheduler=chunked",
        "scheduler.chunk_size=4",
        "workload=fixed",
        "workload.prompt_lens=[10,3]",
        "workload.output_lens=[3,3]",
        "observers=[console]",
        f"hydra.run.dir={tmp_path}",
    )
    assert status == 0, err
    rows = list(csv.DictReader((tmp_path / "steps.csv").open()))
    assert [int(r["prefill_tokens"]) for r in rows[:3]] == [7, 4, 2]
    assert [int(r["decode_tokens"]) for r in rows[:3]] == [0, 1, 1]
    assert [int(r["partial_rows"]) for r in rows[:3]] == [1, 1, 0]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["prefill_chunks"] == 4 and metrics["prefill_tokens"] == 13


def test_chunk_size_is_checked(capsys: Any) -> None:
    status, _, err = cli(capsys, "model=tiny", "scheduler=chunked", "scheduler.chunk_size=0")
    assert_refused(status, err, "scheduler.chunk_size must be >= 1 or null, got 0")


class ChunkedSJF(SJFScheduler):
    """docs/plugins.md: any scheduler chunks with two lines, by overriding `chunk`."""

    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        return chunk_prefill(seq, budget, 5)


class ChunksToNothing(ChunkedSJF):
    def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
        return 0 if seq.num_computed else 5


def third_party(tiny: Any, cls: type[Scheduler], *over: str) -> Any:
    model, _tok = tiny
    engine = build_engine(
        make_cfg("model=tiny", "scheduler=sjf", *over),
        model,
        torch.device("cpu"),
        torch.float32,
        registry().pm.hook,
    )
    engine.p.use("scheduler", cls(engine.p.scheduler.cfg))
    return engine


def prefill_pieces(batches: list[Any]) -> dict[str, list[tuple[int, int]]]:
    """Each request's prefill rows in step order, as (start position, tokens)."""
    pieces: dict[str, list[tuple[int, int]]] = {}
    for b in batches:
        for r in b.rows:
            if r.in_prefill:
                pieces.setdefault(r.seq_id, []).append((r.start_pos, len(r.token_ids)))
    return pieces


def test_a_third_party_scheduler_chunks_through_the_same_support(tiny: Any, reference: Any) -> None:
    """ChunkedSJF cuts every prefill to at most 5 tokens: under a 16-token step each request's
    prompt is computed once, in order, in pieces of 1..5 tokens; with room for every piece,
    in exactly ceil(prompt / 5) pieces of 5 and a remainder, all six prompts side by side."""
    model, tok = tiny
    specs, refs = reference
    lens = {s.id: len(s.prompt_token_ids) for s in specs}  # 45, 3, 30, 61, 9, 17

    engine = third_party(tiny, ChunkedSJF, "engine.max_num_batched_tokens=16")
    spy = Spy(engine.executor)
    engine.executor = spy
    res = engine.run(specs, tok.eos_token_id)
    check_all(model, res, refs)
    pieces = prefill_pieces(spy.batches)
    assert sorted(pieces) == sorted(lens)
    for rid, got in pieces.items():
        starts = [0, *itertools.accumulate(n for _, n in got)][:-1]
        assert [p for p, _ in got] == starts, rid  # contiguous, each token once
        assert sum(n for _, n in got) == lens[rid]
        assert all(1 <= n <= 5 for _, n in got), (rid, got)
    s = summarize(res)
    assert s["prefill_chunks"] == sum(len(v) for v in pieces.values())
    assert s["prefill_tokens"] == sum(lens.values()) == 165
    assert max(st.prefill_tokens + st.decode_tokens for st in res.steps) <= 16

    # Budget enough for all: pieces by hand, ceil(n / 5) each = 9 + 1 + 6 + 13 + 2 + 4.
    engine = third_party(tiny, ChunkedSJF)
    res = engine.run(specs, tok.eos_token_id)
    check_all(model, res, refs)
    s = summarize(res)
    assert s["prefill_chunks"] == 35
    assert s["prefill_tokens"] == 165
    # Step k computes min(5, n - 5k) of every prompt not yet done (r1's 3 in step 0 only).
    per_step = [sum(max(0, min(5, n - 5 * k)) for n in lens.values()) for k in range(13)]
    assert per_step == [28, 24, 20, 17, 15, 15, 10, 10, 10, 5, 5, 5, 1]
    assert [st.prefill_tokens for st in res.steps[:14]] == [*per_step, 0]


def test_a_chunk_rule_that_breaks_the_contract_is_stopped_by_name(
    tiny: Any, reference: Any
) -> None:
    specs, _ = reference
    engine = third_party(tiny, ChunksToNothing)
    broke = r"scheduler policy 'sjf'.*chunked r\d to [05] tokens; it has"
    with pytest.raises(PolicyError, match=broke):
        engine.run(specs, tiny[1].eos_token_id)
