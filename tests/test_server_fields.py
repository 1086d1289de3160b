"""vLLM's extra request fields, which the field's benchmarks and load generators send: each
served (`min_p`, `min_tokens`, the penalties, `add_special_tokens`, `skip_special_tokens`,
`chat_template_kwargs`, `include_stop_str_in_output`) or accepted at its neutral value and
refused otherwise by name (`spaces_between_special_tokens`); a field nobody knows is still
refused by name."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from tests.helpers import hf_greedy  # noqa: E402
from tests.test_penalties import reference  # noqa: E402
from tests.test_server import EOS, FIXED, loaded, served  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "Once upon a time, in a land far away,"


def test_the_load_generators_request_shapes_are_served(tiny: Any, tmp_path: Any) -> None:
    model, tok = tiny
    ids = tok.encode(PROMPT, add_special_tokens=False)
    with served(tmp_path, *FIXED, loaded=loaded(tiny)) as s:
        url = f"{s.url}/v1"
        # `vllm bench serve`'s completions body (its readiness probe's too)
        vllm = {"model": "tiny", "prompt": ids, "temperature": 0.0, "repetition_penalty": 1.0,
                "max_tokens": 5, "logprobs": None, "ignore_eos": True, "stream": False}  # fmt: skip
        r = httpx.post(f"{url}/completions", json=vllm, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == tok.decode(hf_greedy(model, ids, 5, None))
        # aiperf's chat recipe: exact lengths through min_tokens, template arguments
        aiperf = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                  "max_tokens": 6, "min_tokens": 6, "ignore_eos": True,
                  "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
        r = httpx.post(f"{url}/chat/completions", json=aiperf, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
        # inference-perf's
        perf = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "add_special_tokens": False,
                "ignore_eos": True}  # fmt: skip
        r = httpx.post(f"{url}/completions", json=perf, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(ids)

        # min_p = 1: only the most likely token is left, whatever the temperature
        client = s.client()
        drawn = client.completions.create(
            model="tiny", prompt=ids, max_tokens=6, temperature=1.0, seed=4,
            extra_body={**EOS, "min_p": 1.0},
        )  # fmt: skip
        assert drawn.choices[0].text == tok.decode(hf_greedy(model, ids, 6, None))
        # a stop string kept at the end of the text
        plain = (
            client.completions.create(
                model="tiny", prompt=ids, max_tokens=8, temperature=0, extra_body=EOS
            )
            .choices[0]
            .text
        )
        stop = plain[3:6]
        kept = client.completions.create(
            model="tiny", prompt=ids, max_tokens=8, temperature=0, stop=[stop],
            extra_body={**EOS, "include_stop_str_in_output": True},
        )  # fmt: skip
        assert kept.choices[0].text == plain[: plain.index(stop) + len(stop)]

        # the penalties, and min_tokens, as Hugging Face's logits processors apply them
        rule = {"presence_penalty": -2.0, "frequency_penalty": 0.5, "repetition_penalty": 1.2}
        got = client.completions.create(
            model="tiny", prompt=ids, max_tokens=8, temperature=0, extra_body={**EOS, **rule}
        )  # fmt: skip
        want = reference(model, ids, (-2.0, 0.5, 1.2), max_new_tokens=8)
        assert got.choices[0].text == tok.decode(want)
        stop_id = hf_greedy(model, ids, 2, None)[1]
        got = client.completions.create(
            model="tiny", prompt=ids, max_tokens=8, temperature=0,
            extra_body={"stop_token_ids": [stop_id], "min_tokens": 5},
        )  # fmt: skip
        stops = [stop_id, tok.eos_token_id]  # the model's EOS ends it too
        want = reference(model, ids, (0.0, 0.0, 1.0), eos=stops, min_new_tokens=5, max_new_tokens=8)
        assert got.choices[0].text == tok.decode(want[:-1] if want[-1] in stops else want)
        assert got.usage.completion_tokens == len(want) >= 5

        for extra, field in (
            ({"repetition_penalty": 0}, "'repetition_penalty': Input should be greater"),
            ({"min_tokens": 3}, "min_tokens=3 is above max_tokens"),
            ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
            ({"min_p": 2.0}, "min_p"),
            ({"frequency_penalty": 2.5}, "frequency_penalty"),
            ({"mystery_knob": 1}, "unknown field 'mystery_knob'"),
        ):
            r = httpx.post(
                f"{url}/completions", json={"prompt": PROMPT, "max_tokens": 2, **extra}, timeout=60
            )
            assert r.status_code == 400, (extra, r.text)
            assert field in r.json()["error"]["message"], r.text


def test_the_openapi_schema_tells_what_the_server_answers(tiny: Any, tmp_path: Any) -> None:
    """`/openapi.json` and `/docs` served; every refusal documented in OpenAI's error body,
    no 422; the bounds only the model knows (a token id's) in it; a body-less POST, a
    boolean in a number's place and a 405 answered as the schema and RFC 9110 say."""
    _, tok = tiny
    with served(tmp_path, *FIXED, "engine.max_num_seqs=4", loaded=loaded(tiny)) as s:
        schema = httpx.get(f"{s.url}/openapi.json", timeout=60).json()
        assert httpx.get(f"{s.url}/docs", timeout=60).status_code == 200
        for route in ("/v1/completions", "/v1/chat/completions"):
            answers = schema["paths"][route]["post"]["responses"]
            assert "422" not in answers
            assert {"400", "401", "404", "413", "429", "503"} <= set(answers)
            assert answers["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
                "/ErrorResponse"
            )
        body = schema["components"]["schemas"]["CompletionRequest"]["properties"]
        ids = [k for k in body["prompt"]["anyOf"] if k.get("type") == "array"]
        assert ids[0]["items"]["maximum"] == len(tok) - 1
        assert {k.get("maximum") for k in body["n"].get("anyOf", [body["n"]])} >= {4}
        r = httpx.post(f"{s.url}/v1/completions", timeout=60)
        assert r.status_code == 400 and "the request has no body" in r.json()["error"]["message"]
        r = httpx.post(
            f"{s.url}/v1/completions", json={"prompt": "Hi", "logprobs": False}, timeout=60
        )
        assert r.status_code == 400 and "logprobs takes no boolean" in r.text
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [[1], [2]]}, timeout=60)
        assert r.status_code == 400
        r = httpx.delete(f"{s.url}/v1/completions", timeout=60)
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = httpx.get(f"{s.url}/health", timeout=60)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    with served(tmp_path / "off", *FIXED, "server.openapi=false", loaded=loaded(tiny)) as s:
        assert httpx.get(f"{s.url}/openapi.json", timeout=60).status_code == 404
