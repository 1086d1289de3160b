"""Beam search (`sampling.beam_width`): the beams of Hugging Face's `generate(num_beams=W)`,
over shared blocks, under the policies that change how a request is computed.

The beams share their prompt's blocks and each other's (a beam that continues another's
hypothesis takes its blocks); a block two beams hold is copied by the first to write it,
and the engine checks every step that no row writes into a shared one. Kept tokens that a
search drops are counted, so the end check's conservation of tokens still holds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.run.summary import summarize
from tests.helpers import as_hugging_face, assert_refused, cli, make_cfg, run_engine

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ("model=tiny", "engine.block_size=4")
PROMPTS = [list(range(40 + 9 * i, 40 + 9 * i + n)) for i, n in enumerate((13, 18, 7))]


def hf_beams(
    model: Any,
    prompt: list[int],
    width: int,
    max_new: int,
    stop: int | None = None,
    penalty: float = 1.0,
) -> list[list[int]]:
    """Hugging Face's beams, best first: `generate` with `num_beams`, `stop` (if any) as the
    end-of-sequence token, each beam up to its stop."""
    with as_hugging_face(model):
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            num_beams=width,
            num_return_sequences=width,
            do_sample=False,
            max_new_tokens=max_new,
            early_stopping=False,
            length_penalty=penalty,
            eos_token_id=stop,
            pad_token_id=0 if stop is None else stop,
        )
    beams = []
    for row in out:
        tokens = row[len(prompt) :].tolist()
        beams.append(tokens[: tokens.index(stop) + 1] if stop in tokens else tokens)
    return beams


def specs(width: int, max_tokens: int = 9) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"r{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=True, beam_width=width)
        )
        for i, p in enumerate(PROMPTS)
    ]


POLICIES = {
    "default": (),
    "deferred": ("output=deferred", "window=3"),
    "chunked": ("scheduler=chunked", "engine.max_num_batched_tokens=8", "engine.max_num_seqs=6"),
    "prefix_cache": ("allocator=prefix_cache",),
    "preempted": ("allocator=incremental", "engine.num_blocks=26"),
    "worst_case": ("allocator=worst_case",),
}


@pytest.mark.parametrize("policy", POLICIES, ids=list(POLICIES))
def test_beams_are_hugging_faces(tiny: Any, policy: str) -> None:
    model, tok = tiny
    res = run_engine(make_cfg(*BASE, *POLICIES[policy]), model, tok, specs(3))
    outs = {s.id: s.output_token_ids for s in res.seqs}
    for i, prompt in enumerate(PROMPTS):
        assert [outs[f"r{i}#{k}"] for k in range(3)] == hf_beams(model, prompt, 3, 9)
    m = summarize(res)
    assert m["beam_rounds"] == 3 * 9
    assert m["beam_retables"] > 0 and m["kv_sharing_saving"] > 0
    if policy == "preempted":
        assert sum(s.preemptions for s in res.seqs) > 0


def test_a_beam_search_of_width_one_is_greedy_and_scores_are_kept(tiny: Any) -> None:
    model, tok = tiny
    res = run_engine(make_cfg(*BASE), model, tok, specs(4, max_tokens=6))
    for seq in res.seqs:
        assert len(seq.output_logprobs) == len(seq.output_token_ids) == 6
        assert all(e is not None and len(e.top) == 8 for e in seq.output_logprobs)
    best = [s for s in res.seqs if s.sample_index == 0]
    sums = {s.id: sum(e.logprob for e in s.output_logprobs if e is not None) for s in res.seqs}
    for seq in best:  # the first beam is the most likely of its request's
        group = seq.group
        assert group is not None
        assert sums[seq.id] == max(sums[m.id] for m in group.members)


@pytest.mark.parametrize("penalty", [1.0, 0.0, 2.0])
def test_hypotheses_that_stop_are_hugging_faces(tiny: Any, penalty: float) -> None:
    """A continuation that ends on a stop token is a finished hypothesis; the search ends
    when the best W finished ones cannot be beaten, as Hugging Face's does (the stop token
    is one its beams meet part way)."""
    model, tok = tiny
    prompt = PROMPTS[1]
    met = [t for beam in hf_beams(model, prompt, 3, 9) for t in beam[2:]]
    stop = next(  # a token that ends one of Hugging Face's beams
        t for t in met if any(b[-1] == t for b in hf_beams(model, prompt, 3, 9, t, penalty))
    )
    spec = RequestSpec(
        "r0",
        prompt,
        SamplingParams(max_tokens=9, stop_token_ids=(stop,), beam_width=3, length_penalty=penalty),
    )
    res = run_engine(make_cfg(*BASE), model, tok, [spec])
    ours = [s.output_token_ids for s in sorted(res.seqs, key=lambda s: s.sample_index)]
    assert ours == hf_beams(model, prompt, 3, 9, stop, penalty)
    assert any(o[-1] == stop for o in ours)
    m = summarize(res)
    assert m["pruned_tokens"] == 3 * m["beam_rounds"] - sum(map(len, ours))


def test_beams_are_lines_of_outputs_jsonl_and_bad_settings_are_refused(
    capsys: Any, tmp_path: Any
) -> None:
    for args, said in (
        (("executor=simulated", "workload=fixed"), "a simulated executor has no logits"),
        (("model=tiny", "engine.kv_layout=contiguous", "allocator=worst_case"), "kv_layout=paged"),
        (("model=tiny", "workload.temperature=0.7"), "beam search is greedy"),
        (("model=tiny", "workload.n=4"), "workload.n=4 beams returned must be <= beam_width"),
        (("model=tiny", "engine.max_num_seqs=2"), "cannot run side by side"),
    ):
        status, _, err = cli(capsys, *args, "workload.beam_width=3")
        assert_refused(status, err, "workload.beam_width=3: ")
        assert said in err
    status, _, err = cli(
        capsys, "model=tiny", "workload=fixed", "workload.prompt_lens=[9]",
        "workload.output_lens=[4]", "workload.beam_width=2", f"hydra.run.dir={tmp_path}",
        "observers=[]",
    )  # fmt: skip
    assert status == 0, err
    lines = [json.loads(x) for x in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert [(x["id"], x["request_id"], x["index"]) for x in lines] == [
        ("r0#0", "r0", 0),
        ("r0#1", "r0", 1),
    ]
    assert all(len(x["output_token_ids"]) == 4 for x in lines)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["beam_rounds"] == 4
