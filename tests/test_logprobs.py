"""Log-probabilities (`sampling.logprobs`, `sampling.prompt_logprobs`): read back with the
tokens, equal to Hugging Face's `log_softmax` of the same model's logits.

Each output token's and each prompt token's entry is checked against one full forward of
the reference model over the request's final tokens, within fp32 tolerance, with the top-k
alternatives by id; under every policy that changes how a request is computed (chunks,
deferred output, preemption by recompute and by swap, a prefix cache, parallel samples),
and asking for them changes no token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import Sequence
from framework.core.token_logprob import TokenLogprob
from tests.helpers import COMPUTE_POLICIES as POLICIES
from tests.helpers import as_hugging_face, assert_refused, cli, hf_greedy, make_cfg, run_engine

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ("model=tiny", "engine.block_size=4")
PROMPTS = [list(range(30 + 7 * i, 30 + 7 * i + n)) for i, n in enumerate((21, 26, 9, 30))]
TOL = 1e-5


def specs(top: int | None = 5, prompt: int | None = None, **kw: Any) -> list[RequestSpec]:
    fields: dict[str, Any] = {"max_tokens": 10, "ignore_eos": True, "seed": 0}
    fields.update(kw)
    return [
        RequestSpec(
            f"r{i}",
            p,
            SamplingParams(logprobs=top, prompt_logprobs=prompt, **{**fields, "seed": i}),
        )
        for i, p in enumerate(PROMPTS)
    ]


# The references are pure functions of the (session-wide, never modified) tiny model and the
# token ids, and the greedy tests ask for the same ones under every policy: each is computed
# once per process and shared.
_REFERENCES: dict[tuple[int, ...], torch.Tensor] = {}
_GREEDY: dict[tuple[int, ...], list[int]] = {}


@pytest.fixture(scope="module", autouse=True)
def _drop_references() -> Iterator[None]:
    """The references (a vocabulary-wide row per token) are freed with the module."""
    yield
    _REFERENCES.clear()
    _GREEDY.clear()


def reference(model: Any, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] log-softmax of Hugging Face's own forward over `ids` (sdpa, its
    eager modules): row p scores the token at p + 1."""
    key = tuple(ids)
    if key not in _REFERENCES:
        with as_hugging_face(model):
            logits = model(torch.tensor([ids])).logits[0].float()
        _REFERENCES[key] = torch.log_softmax(logits, dim=-1)
    return _REFERENCES[key]


def greedy(model: Any, prompt: list[int], max_new: int) -> list[int]:
    """`hf_greedy` (EOS ignored), once per prompt and length."""
    key = (max_new, *prompt)
    if key not in _GREEDY:
        _GREEDY[key] = hf_greedy(model, prompt, max_new, None)
    return list(_GREEDY[key])


def check_entry(entry: TokenLogprob | None, ref: torch.Tensor, token: int, k: int) -> None:
    assert entry is not None
    assert abs(entry.logprob - ref[token].item()) < TOL
    assert len(entry.top) == k
    want = torch.topk(ref, k)
    assert [t for t, _ in entry.top] == want.indices.tolist()
    assert max((abs(v - w) for (_, v), w in zip(entry.top, want.values.tolist(), strict=True)),
               default=0.0) < TOL  # fmt: skip


def check_seq(model: Any, seq: Sequence, top: int | None, prompt_top: int | None) -> None:
    prompt = seq.spec.prompt_token_ids
    ids = prompt + seq.output_token_ids
    ref = reference(model, ids)
    if top is None:
        assert seq.output_logprobs == []
    else:
        assert len(seq.output_logprobs) == len(seq.output_token_ids)
        for i, token in enumerate(seq.output_token_ids):
            check_entry(seq.output_logprobs[i], ref[len(prompt) + i - 1], token, top)
    if prompt_top is None:
        assert seq.prompt_logprobs == []
    else:
        scored = seq.group.leader if seq.group is not None else seq
        assert len(scored.prompt_logprobs) == len(prompt)
        assert scored.prompt_logprobs[0] is None  # nothing predicts the first token
        for p in range(1, len(prompt)):
            check_entry(scored.prompt_logprobs[p], ref[p - 1], prompt[p], prompt_top)


@pytest.mark.parametrize("policy", POLICIES, ids=list(POLICIES))
def test_logprobs_equal_hugging_faces_under_every_policy(tiny: Any, policy: str) -> None:
    model, tok = tiny
    res = run_engine(make_cfg(*BASE, *POLICIES[policy]), model, tok, specs(5, 3))
    for seq in res.seqs:
        assert seq.output_token_ids == greedy(model, seq.spec.prompt_token_ids, 10)
        check_seq(model, seq, 5, 3)
    if policy in ("preempted", "swapped"):
        assert sum(s.preemptions for s in res.seqs) > 0


def test_sampled_tokens_and_parallel_samples_are_scored(tiny: Any) -> None:
    """A drawn token's entry is its own (whatever it drew), each sample's its own, and the
    prompt's entries are the request's once, on its first sample."""
    model, tok = tiny
    asked = specs(2, 1, temperature=0.9, n=2)
    res = run_engine(make_cfg(*BASE, "output=deferred", "window=2"), model, tok, asked)
    plain = run_engine(make_cfg(*BASE), model, tok, specs(None, None, temperature=0.9, n=2))
    assert {s.id: s.output_token_ids for s in res.seqs} == {
        s.id: s.output_token_ids for s in plain.seqs
    }  # asking changes no draw
    assert len(res.seqs) == 2 * len(PROMPTS)
    for seq in res.seqs:
        check_seq(model, seq, 2, 1)


def test_a_stop_token_seen_late_leaves_no_entry_past_it(tiny: Any) -> None:
    """Deferred output computes past a stop it has not seen yet: those tokens are thrown
    away, and so are their entries."""
    model, tok = tiny
    ref = greedy(model, PROMPTS[0], 10)
    stop = ref[3]
    spec = RequestSpec(
        "r0", PROMPTS[0], SamplingParams(max_tokens=10, stop_token_ids=(stop,), logprobs=0)
    )
    res = run_engine(make_cfg(*BASE, "output=deferred", "window=6"), model, tok, [spec])
    seq = res.seqs[0]
    assert seq.output_token_ids == ref[: ref.index(stop) + 1]
    assert len(seq.output_logprobs) == len(seq.output_token_ids)
    check_seq(model, seq, 0, None)


def test_prompt_scoring_takes_nothing_from_the_prefix_cache(tiny: Any) -> None:
    model, tok = tiny
    first = RequestSpec("a", PROMPTS[3], SamplingParams(max_tokens=4, ignore_eos=True))
    second = RequestSpec(
        "b", PROMPTS[3], SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=0),
        arrival=0.5,
    )  # fmt: skip
    res = run_engine(make_cfg(*BASE, "allocator=prefix_cache"), model, tok, [first, second])
    seq = next(s for s in res.seqs if s.id == "b")
    check_seq(model, seq, None, 0)


def test_outputs_jsonl_carries_them_and_a_simulator_refuses_them(
    tiny: Any, capsys: Any, tmp_path: Any
) -> None:
    status, _, err = cli(capsys, "executor=simulated", "workload=fixed", "workload.logprobs=2")
    assert_refused(status, err, "workload.logprobs=2: a simulated executor has no logits")
    status, _, err = cli(capsys, "model=tiny", "workload.logprobs=-1")
    assert_refused(status, err, "workload.logprobs must be >= 0")
    status, _, err = cli(
        capsys, "model=tiny", "workload=fixed", "workload.prompt_lens=[9,5]",
        "workload.output_lens=[4,3]", "workload.logprobs=2", "workload.prompt_logprobs=0",
        f"hydra.run.dir={tmp_path}", "observers=[]",
    )  # fmt: skip
    assert status == 0, err
    lines = [json.loads(x) for x in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert len(line["logprobs"]) == len(line["output_token_ids"])
        for token, entry in zip(line["output_token_ids"], line["logprobs"], strict=True):
            assert entry["token"] == token and len(entry["top"]) == 2
            assert entry["logprob"] <= entry["top"][0][1] + TOL
        assert line["prompt_logprobs"][0] is None
        assert all(e["top"] == [] for e in line["prompt_logprobs"][1:])
