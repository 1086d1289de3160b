"""The server's log-probabilities (`logprobs`, `top_logprobs`, `echo`) in OpenAI's shapes,
through the official `openai` client, whole and streamed: equal to Hugging Face's
`log_softmax` of the same model's logits, the answer's text unchanged by asking, and
lm-evaluation-harness's loglikelihood request (`echo`, `logprobs=1`, `max_tokens=1`)
scored over the prompt; `best_of` ranked by them; vLLM's beam search."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from tests.helpers import hf_greedy  # noqa: E402
from tests.test_beam_search import hf_beams  # noqa: E402
from tests.test_logprobs import TOL, reference  # noqa: E402
from tests.test_server import EOS, FIXED, loaded, served  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "Once upon a time, in a land far away,"


def test_completion_logprobs_whole_streamed_and_echoed(tiny: Any, tmp_path: Any) -> None:
    model, tok = tiny
    ids = tok.encode(PROMPT, add_special_tokens=False)
    want = hf_greedy(model, ids, 6, None)
    ref = reference(model, ids + want)
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        client = s.client()
        ask = {"model": "tiny", "prompt": ids, "max_tokens": 6, "temperature": 0,
               "extra_body": EOS}  # fmt: skip
        plain = client.completions.create(**ask)
        whole = client.completions.create(**ask, logprobs=5)
        choice = whole.choices[0]
        assert choice.text == plain.choices[0].text == tok.decode(want)  # asking changes nothing
        lp = choice.logprobs
        assert lp.tokens == [tok.decode([t]) for t in want]
        for i, token in enumerate(want):
            row = ref[len(ids) + i - 1]
            assert abs(lp.token_logprobs[i] - row[token].item()) < TOL
            best = row.topk(5)
            top = lp.top_logprobs[i]
            for t, v in zip(best.indices.tolist(), best.values.tolist(), strict=True):
                assert abs(top[tok.decode([t])] - v) < TOL
        assert lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(len(want))]

        streamed: list[float] = []
        for chunk in client.completions.create(**ask, logprobs=5, stream=True):
            for c in chunk.choices:
                if c.logprobs is not None:
                    streamed += c.logprobs.token_logprobs
        assert streamed == lp.token_logprobs

        # lm-evaluation-harness's loglikelihood request: the prompt scored, one token after
        scored = client.completions.create(
            model="tiny", prompt=ids, max_tokens=1, temperature=0, logprobs=1, echo=True,
            extra_body=EOS,
        ).choices[0]  # fmt: skip
        assert scored.text == tok.decode(ids) + tok.decode(want[:1])
        values = scored.logprobs.token_logprobs
        assert len(values) == len(ids) + 1 and values[0] is None
        assert scored.logprobs.top_logprobs[0] is None
        for p in range(1, len(ids)):
            assert abs(values[p] - ref[p - 1][ids[p]].item()) < TOL
            assert len(scored.logprobs.top_logprobs[p]) == 1
        text = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=2, temperature=0, echo=True, extra_body=EOS
        ).choices[0]
        assert text.text.startswith(PROMPT) and text.logprobs is None


def test_chat_logprobs_and_refusals(tiny: Any, tmp_path: Any) -> None:
    model, tok = tiny
    messages = [{"role": "user", "content": "Name a colour."}]
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        client = s.client()
        answer = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=5, temperature=0, logprobs=True,
            top_logprobs=3, extra_body=EOS,
        )  # fmt: skip
        seq = s.seq(answer.id)
        ref = reference(model, seq.spec.prompt_token_ids + seq.output_token_ids)
        content = answer.choices[0].logprobs.content
        assert len(content) == 5
        start = len(seq.spec.prompt_token_ids) - 1
        for i, (entry, token) in enumerate(zip(content, seq.output_token_ids, strict=True)):
            assert entry.token == tok.decode([token])
            assert entry.bytes == list(entry.token.encode())
            assert abs(entry.logprob - ref[start + i][token].item()) < TOL
            assert len(entry.top_logprobs) == 3
        bare = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=3, temperature=0, logprobs=True
        )
        assert all(e.top_logprobs == [] for e in bare.choices[0].logprobs.content)

        alone = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, temperature=0, top_logprobs=2
        )  # without logprobs: nothing scored
        assert alone.choices[0].logprobs is None
        for extra, field in (({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=2, **extra
                )
            assert field in str(caught.value)


def test_a_simulated_server_refuses_logprobs_by_name(tmp_path: Any) -> None:
    with served(tmp_path, "executor=simulated", "model=tiny") as s:
        with pytest.raises(openai.BadRequestError) as caught:
            s.client().completions.create(model="tiny", prompt=[1, 2, 3], logprobs=1)
        assert "logprobs: this server's executor computes no log-probabilities" in str(caught.value)


def test_best_of_returns_the_n_most_likely_samples(tiny: Any, tmp_path: Any) -> None:
    """`best_of` samples run; the `n` with the highest mean log-probability per token come
    back, best first, and `usage` counts every sample's tokens."""
    _, tok = tiny
    ids = tok.encode(PROMPT, add_special_tokens=False)
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        client = s.client()
        answer = client.completions.create(
            model="tiny", prompt=ids, max_tokens=5, temperature=1.0, seed=5, n=2, best_of=4,
            extra_body=EOS,
        )  # fmt: skip
        seqs = [s.seq(f"{answer.id}#{k}") for k in range(4)]
        mean = [sum(e.logprob for e in q.output_logprobs) / 5 for q in seqs]
        best = sorted(range(4), key=lambda k: -mean[k])[:2]
        assert [c.text for c in answer.choices] == [
            tok.decode(seqs[k].output_token_ids) for k in best
        ]
        assert [c.index for c in answer.choices] == [0, 1]
        assert all(c.logprobs is None for c in answer.choices)  # ranked by them, not asked
        assert answer.usage.completion_tokens == 20
        for extra, said in (
            ({"n": 3, "best_of": 2}, "best_of=2 is below n=3"),
            ({"best_of": 3, "stream": True}, "best_of above n cannot be streamed"),
            ({"best_of": 99}, "best_of=99 samples cannot run side by side"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(model="tiny", prompt=ids, max_tokens=2, **extra)
            assert said in str(caught.value)


def test_beam_search_returns_hugging_faces_best_beams(tiny: Any, tmp_path: Any) -> None:
    """vLLM's `use_beam_search`: `best_of` beams, the best `n` returned, not streamed."""
    model, tok = tiny
    ids = tok.encode(PROMPT, add_special_tokens=False)
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        client = s.client()
        answer = client.completions.create(
            model="tiny", prompt=ids, max_tokens=6, temperature=0, n=2, best_of=3,
            extra_body={**EOS, "use_beam_search": True},
        )  # fmt: skip
        want = hf_beams(model, ids, 3, 6)[:2]
        assert [c.text for c in answer.choices] == [tok.decode(b) for b in want]
        for extra, said in (
            ({"temperature": 1.0}, "use_beam_search: beam search is greedy"),
            ({"temperature": 0, "n": 1}, "use_beam_search: beam search needs best_of"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(
                    model="tiny", prompt=ids, max_tokens=2, extra_body={"use_beam_search": True},
                    **extra,
                )  # fmt: skip
            assert said in str(caught.value)
