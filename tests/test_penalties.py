"""Penalties (`presence_penalty`, `frequency_penalty`, `repetition_penalty`) and `min_tokens`:
greedy answers equal Hugging Face `generate`'s with the same rules as logits processors,
token for token in fp32, under every policy that changes how a request is computed (deferred
output, chunks, preemption by recompute and by swap, a prefix cache, a static batch), each
request with its own penalties beside requests with none."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.sequence_state import SequenceStates
from framework.executors.penalties import TokenCounts
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from tests.helpers import (
    COMPUTE_POLICIES,
    as_hugging_face,
    assert_refused,
    cli,
    make_cfg,
    run_engine,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# kernels set, not measured at each engine's start (seconds each); greedy through the argmax
# kernel, which reads the masked and penalized logits
BASE = (
    "model=tiny", "engine.block_size=4", "engine.packed_linears=false",
    "engine.paged_kernel=true", "engine.argmax_kernel=true", "engine.layer_glue=false",
)  # fmt: skip
PROMPTS = [[40 + (5 * i + 3 * j) % 11 for j in range(n)] for i, n in enumerate((19, 24, 9, 28))]
# each prompt's penalties (presence, frequency, repetition); the third request has none. This
# random model repeats no token of its own: boosts (below 0, below 1) make it, so that the
# penalties above 0 and 1 have repeats to bite on.
RULES = [(-2.0, 0.0, 1.2), (0.0, -1.5, 1.0), (0.0, 0.0, 1.0), (-1.5, 0.7, 0.6)]
MAX = 12


class OutputPenalties(LogitsProcessor):
    """OpenAI's presence and frequency penalties over the tokens generated so far: the
    reference, written apart from the engine's."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for row, ids in enumerate(input_ids[:, self.prompt_len :]):
            counts = torch.bincount(ids, minlength=scores.shape[-1]).to(scores.dtype)
            out[row] -= self.frequency * counts + self.presence * (counts > 0).to(scores.dtype)
        return out


def reference(model: Any, prompt: list[int], rule: tuple[float, ...], **kw: Any) -> list[int]:
    """Hugging Face's greedy answer under `rule` (presence, frequency, repetition)."""
    presence, frequency, repetition = rule
    processors = LogitsProcessorList([OutputPenalties(len(prompt), presence, frequency)])
    eos = kw.pop("eos", None)
    kw.setdefault("max_new_tokens", MAX)
    with as_hugging_face(model):
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            repetition_penalty=repetition,
            logits_processor=processors,
            eos_token_id=eos,
            pad_token_id=0,
            **kw,
        )
    return out[0, len(prompt) :].tolist()


def specs(**kw: Any) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"r{i}", p,
            SamplingParams(max_tokens=MAX, ignore_eos=True, presence_penalty=r[0],
                           frequency_penalty=r[1], repetition_penalty=r[2], **kw),
        )
        for i, (p, r) in enumerate(zip(PROMPTS, RULES, strict=True))
    ]  # fmt: skip


POLICIES = {**COMPUTE_POLICIES, "static": ("scheduler=static",)}


@pytest.mark.parametrize("policy", POLICIES, ids=list(POLICIES))
def test_penalized_greedy_equals_hugging_faces_under_every_policy(tiny: Any, policy: str) -> None:
    model, tok = tiny
    res = run_engine(make_cfg(*BASE, *POLICIES[policy]), model, tok, specs())
    for seq, rule in zip(sorted(res.seqs, key=lambda s: s.id), RULES, strict=True):
        assert seq.output_token_ids == reference(model, seq.spec.prompt_token_ids, rule), seq.id
    if policy in ("preempted", "swapped"):
        assert sum(s.preemptions for s in res.seqs) > 0


def test_each_penalty_changes_its_answer(tiny: Any) -> None:
    """What the test above compares is no neutral case: each rule changes its answer."""
    model, _ = tiny
    for prompt, rule in zip(PROMPTS, RULES, strict=True):
        changed = reference(model, prompt, rule) != reference(model, prompt, (0.0, 0.0, 1.0))
        assert changed == (rule != (0.0, 0.0, 1.0)), rule


def test_min_tokens_masks_the_stop_token_until_then(tiny: Any) -> None:
    model, tok = tiny
    plain = reference(model, PROMPTS[1], (0.0, 0.0, 1.0))
    stop = plain[1]  # greedy would stop at its second token
    spec = RequestSpec(
        "r0", PROMPTS[1], SamplingParams(max_tokens=MAX, stop_token_ids=(stop,), min_tokens=6)
    )
    for policy in ("default", "deferred"):
        res = run_engine(make_cfg(*BASE, *POLICIES[policy]), model, tok, [spec])
        want = reference(model, PROMPTS[1], (0.0, 0.0, 1.0), eos=stop, min_new_tokens=6)
        got = res.seqs[0].output_token_ids
        assert got == want and len(got) >= 6 and stop not in got[:6], (got, want)


def test_drawn_answers_depend_on_their_seed_and_no_count_outlives_its_request(tiny: Any) -> None:
    """A drawn answer with penalties depends on its seed alone: the same under deferred
    output as immediate, in one batch or one at a time; and once every request has ended
    (the next batch says so), the executor keeps no count of it."""
    model, tok = tiny
    drawn = specs(temperature=0.9, seed=7, n=2)
    answers = []
    for policy in ("default", "deferred"):
        cfg = make_cfg(*BASE, *POLICIES[policy])
        answers.append({s.id: s.output_token_ids for s in run_engine(cfg, model, tok, drawn).seqs})
    alone = {}
    for one in drawn:
        res = run_engine(make_cfg(*BASE), model, tok, [one])
        alone.update({s.id: s.output_token_ids for s in res.seqs})
    assert answers[0] == answers[1] == alone
    cfg = make_cfg(*BASE)
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    engine.prepare()  # as the server drives it: requests submitted, steps advanced
    for one in drawn:
        engine.submit(one, tok.eos_token_id)
    while engine.has_work:
        engine.advance()
    counts = engine.executor.counts
    # Those that ended in the last steps: no batch has said so yet.
    assert len(counts) > 0 and set(counts.slot) <= {f"{s.id}#{k}" for s in drawn for k in (0, 1)}
    engine.submit(RequestSpec("x", [5, 6], SamplingParams(max_tokens=2)), tok.eos_token_id)
    while engine.has_work:
        engine.advance()
    assert len(counts) == 0
    engine.finish()


def test_counts_start_once_and_end_once() -> None:
    """The executor's table: a sequence's slot starts from its tokens so far, grows from
    the sampled tensor, and is freed when the batch says it ended (then reused)."""
    counts = TokenCounts(16, torch.device("cpu"))
    slot = counts._start("a", [1, 2, 2], [3, 3])
    assert counts.counts[slot].tolist()[3] == 2
    assert counts.prompt[slot].nonzero().flatten().tolist() == [1, 2]
    counts.count(torch.tensor([5, 3]), (torch.tensor([1]), torch.tensor([slot])))
    assert counts.counts[slot].tolist()[3] == 3
    counts.end(("a", "unknown"))
    assert len(counts) == 0 and counts.free[-1] == slot
    again = counts._start("b", [4], [])
    assert again == slot and counts.counts[slot].sum().item() == 0
    assert SequenceStates().ended() == ()


def test_refusals(capsys: Any) -> None:
    asked = ("workload=fixed", "workload.presence_penalty=0.5")
    status, _, err = cli(capsys, "executor=simulated", *asked)
    assert_refused(status, err, "workload.presence_penalty=0.5: a simulated executor has no logits")
    status, _, err = cli(capsys, "model=tiny", "workload.repetition_penalty=0")
    assert_refused(status, err, "workload.repetition_penalty must be > 0")
    status, _, err = cli(capsys, "model=tiny", "workload.beam_width=2", "workload.min_tokens=2")
    assert_refused(status, err, "no workload.min_tokens")
    with pytest.raises(ValueError, match="frequency_penalty must be in"):
        SamplingParams(frequency_penalty=2.5)


def test_a_stop_string_counts_from_the_min_tokens_th_token() -> None:
    """As vLLM: a stop string completed by a token before the `min_tokens`-th is not one."""
    from framework.serve.text import TextStream

    class Letters:  # token i is the letter chr(97 + i)
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(chr(97 + i) for i in ids)

    word = [1, 0, 1, 0, 1, 0]  # "bababa"
    for min_tokens, stopped_at in ((0, 2), (2, 2), (3, 4), (4, 4), (6, 6), (7, None)):
        text = TextStream(Letters(), ["ba"], min_tokens=min_tokens)
        out = "".join(text.add([t]) for t in word) + text.finish()
        if stopped_at is None:
            assert not text.stopped and out == "bababa"
        else:
            assert text.stopped and text.tokens == stopped_at, (min_tokens, text.tokens)
            assert out == "ba" * (stopped_at // 2 - 1), (min_tokens, out)


@pytest.mark.parametrize(
    "cluster",
    [
        ("cluster.replicas=2", "router=round_robin"),
        ("cluster.replicas=2", "cluster.faults=[{replica: 1, down_at_s: 0.002}]"),
    ],
    ids=["replicas", "faulted"],
)
def test_a_cluster_gives_one_engines_penalized_answers(tiny: Any, cluster: tuple[str, ...]) -> None:
    """Each replica keeps the counts of its own sequences; one recomputed on another replica
    after its own failed starts its counts there from the tokens it has (`Row.history`)."""
    from framework.run.app import build_runner

    model, tok = tiny
    real = (*BASE, "observers=[]", "engine.max_num_seqs=4", "output=deferred", "window=2")
    hooks = registry().pm.hook
    work = specs()
    alone = build_runner(make_cfg(*real), model, torch.device("cpu"), torch.float32, hooks)
    want = {s.id: s.output_token_ids for s in alone.run(work, tok.eos_token_id).seqs}
    runner = build_runner(
        make_cfg(*real, *cluster), model, torch.device("cpu"), torch.float32, hooks
    )
    result = runner.run(work, tok.eos_token_id)
    got = {s.id: s.output_token_ids for s in result.seqs if s.finish_reason is not None}
    assert got == want
