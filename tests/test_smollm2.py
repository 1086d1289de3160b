"""The real model: greedy output of SmolLM2-135M-Instruct equals Hugging Face `generate`,
token for token, under every scheduler x allocator, with and without a pool tight enough to
force preemption. Marked slow (deselect with -m 'not slow'); CI runs it."""

from __future__ import annotations

import dataclasses

import pytest

from framework.run.summary import summarize
from framework.workloads import build_workload
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, run_engine

pytestmark = pytest.mark.slow
# New tokens per request: enough that three of the eight chat answers end by EOS (after 8, 14
# and 17 tokens; test_eos_stops_where_hf_stops asserts some do) and that the 14-block pool
# preempts (asserted where used), and few enough for CI's budget: every decode step of every
# case, and of the batch-1 references, costs a full forward of the real model.
NEW = 20


@pytest.fixture(scope="module")
def chat(smollm2, shared):
    model, tok = smollm2
    specs = build_workload({"kind": "chat", "limit": 8, "max_tokens": NEW}, tok)
    forced = [
        dataclasses.replace(s, sampling=dataclasses.replace(s.sampling, ignore_eos=True))
        for s in specs
    ]
    key = ["smollm2", "float32", NEW, [s.prompt_token_ids for s in forced]]
    refs = shared.get(
        key, lambda: {s.id: hf_greedy(model, s.prompt_token_ids, NEW, None) for s in forced}
    )
    return forced, refs


def test_tight_pool_setting_preempts(smollm2, chat) -> None:
    model, tok = smollm2
    specs, refs = chat
    cfg = make_cfg("model=smollm2", "allocator=incremental", "engine.num_blocks=14")
    res = run_engine(cfg, model, tok, specs)
    assert summarize(res)["preemptions"] > 0
    for seq in res.seqs:
        check_same_greedy(
            model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, refs[seq.id]
        )


@pytest.mark.parametrize(
    ("scheduler", "allocator", "blocks"),
    [
        # Under an ample pool the allocator changes only which block ids a request gets, not
        # which requests run together: the model computes the same batches, so each scheduler
        # runs there with one allocator. The incremental allocator meets each scheduler under
        # the 14-block pool, where it preempts (continuous: test_tight_pool_setting_preempts;
        # with an ample pool: test_eos_stops_where_hf_stops). Worst-case reservation under that
        # pool just admits fewer rows at a time; the tiny-model tests (test_equivalence.py)
        # run every scheduler x allocator x pool, block bookkeeping included.
        ("static", "worst_case", None),
        ("continuous", "worst_case", None),
        ("static", "incremental", 14),
    ],
)
def test_greedy_matches_hf_generate(smollm2, chat, scheduler, allocator, blocks) -> None:
    model, tok = smollm2
    specs, refs = chat
    overrides = ["model=smollm2", f"scheduler={scheduler}", f"allocator={allocator}"]
    if blocks:
        overrides.append(f"engine.num_blocks={blocks}")
    res = run_engine(make_cfg(*overrides), model, tok, specs)
    assert summarize(res)["requests_finished"] == 8
    assert all(len(s.output_token_ids) == NEW for s in res.seqs)
    for seq in res.seqs:
        check_same_greedy(
            model,
            seq.spec.prompt_token_ids,
            f"{scheduler}/{allocator}/{blocks} {seq.id}",
            seq.output_token_ids,
            refs[seq.id],
        )


def test_eos_stops_where_hf_stops(smollm2, chat) -> None:
    """With EOS honoured, each answer is the reference cut at its first EOS."""
    model, tok = smollm2
    specs, refs = chat
    natural = [
        dataclasses.replace(s, sampling=dataclasses.replace(s.sampling, ignore_eos=False))
        for s in specs
    ]
    res = run_engine(make_cfg("model=smollm2"), model, tok, natural)
    stopped = 0
    for seq in res.seqs:
        ref = refs[seq.id]
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
            stopped += 1
        check_same_greedy(model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, ref)
        assert seq.finish_reason == ("stop" if ref[-1] == tok.eos_token_id else "length")
    assert stopped > 0, "no prompt ended by EOS: this test would not test stopping"


@pytest.mark.parametrize(
    "output", ["window=8", "adaptive"]
)  # every window and combination runs on the tiny model (test_output_policies.py); here the
# widest window (the most overshoot past a real EOS) and the adaptive one
def test_deferred_output_keeps_every_token(smollm2, chat, output) -> None:
    """Real EOS stops under deferral: the same text as immediate and as HF, with overshoot
    counted and the books balanced."""
    model, tok = smollm2
    specs, refs = chat
    natural = [
        dataclasses.replace(s, sampling=dataclasses.replace(s.sampling, ignore_eos=False))
        for s in specs
    ]
    over = ["output=adaptive"] if output == "adaptive" else ["output=deferred", output]
    res = run_engine(make_cfg("model=smollm2", *over), model, tok, natural)
    for seq in res.seqs:
        ref = refs[seq.id]
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        check_same_greedy(model, seq.spec.prompt_token_ids, seq.id, seq.output_token_ids, ref)
    s = summarize(res)
    assert s["deferred_tokens"] == s["tokens_kept"] + s["overshoot_tokens"]
    if output != "adaptive" and output != "window=1":
        assert s["transfers_per_step"] < 1


@pytest.mark.parametrize(
    "over",
    [
        ("scheduler.chunk_size=1",),
        ("scheduler.chunk_size=16",),  # one block
        ("scheduler.chunk_size=null",),  # only the budget cuts
        # 7-token chunks (not aligned to a block), under a pool that preempts, so that a
        # preempted request's prompt is recomputed in chunks too; with deferred output
        ("scheduler.chunk_size=7", "engine.num_blocks=14", "output=deferred", "window=4"),
    ],
    ids=["chunk1", "chunk_block", "chunk_budget", "chunk7_tight_deferred4"],
)
def test_chunked_prefill_matches_hf_generate_over_the_budget(smollm2, chat, over) -> None:
    """Every request (prompt + NEW tokens) is longer than the 32-token step budget, which an
    unchunked scheduler would refuse: served in chunks, the tokens of HF `generate`."""
    model, tok = smollm2
    specs, refs = chat
    assert all(len(s.prompt_token_ids) + NEW > 32 for s in specs)
    cfg = make_cfg("model=smollm2", "scheduler=chunked", "engine.max_num_batched_tokens=32", *over)
    res = run_engine(cfg, model, tok, specs)
    s = summarize(res)
    assert s["requests_finished"] == 8 and s["prefill_chunks"] > 8
    if "engine.num_blocks=14" in over:
        assert s["preemptions"] > 0  # and so a chunked recompute
    for seq in res.seqs:
        check_same_greedy(
            model, seq.spec.prompt_token_ids, f"{over} {seq.id}", seq.output_token_ids, refs[seq.id]
        )


@pytest.mark.parametrize(
    "over",
    [
        ("engine.max_num_seqs=2",),
        ("engine.max_num_seqs=4", "engine.num_blocks=14", "output=deferred", "window=4"),
        ("engine.max_num_seqs=3", "scheduler=chunked", "scheduler.chunk_size=16"),
        ("engine.max_num_seqs=2", "scheduler=lpm", "engine.num_blocks=14"),
    ],
    ids=["two_rows", "tight_deferred4", "chunked16", "lpm_tight"],
)
def test_prefix_cache_matches_hf_generate(smollm2, chat, over) -> None:
    """The chat prompts share their template's system turn: with the cache on, later
    requests reuse its blocks, and every answer is still HF `generate`'s."""
    model, tok = smollm2
    specs, refs = chat
    res = run_engine(make_cfg("model=smollm2", "allocator=prefix_cache", *over), model, tok, specs)
    s = summarize(res)
    assert s["requests_finished"] == 8 and s["prefix_hit_tokens"] > 0
    for seq in res.seqs:
        check_same_greedy(
            model, seq.spec.prompt_token_ids, f"{over} {seq.id}", seq.output_token_ids, refs[seq.id]
        )
