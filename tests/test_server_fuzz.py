"""The server fuzzed from its own OpenAPI schema by schemathesis, a tool nobody here wrote:
every operation of `/openapi.json`, with bodies that fit the schema (positive) and bodies
that break it (negative), each answer judged by schemathesis's default checks (no 5xx,
statuses, content types and bodies as the schema documents them, valid data accepted,
invalid data refused). A tiny-model server in this process on 127.0.0.1, bounded in time
(`server.stop_after_s`) and in cases; derandomized, so CI draws the same cases each run.

A JSON schema cannot carry a rule that spans two fields; the bodies that break one of those
rules are left out of the fuzzing (`broken_rule`, each rule named), and
`test_each_cross_field_rule_is_refused_by_name` sends one of each and checks the 400 names
the field (docs/server.md, "The OpenAPI schema")."""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
httpx = pytest.importorskip("httpx2")
requests = pytest.importorskip("requests")  # schemathesis's transport

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.config import OutputConfig, SanitizationConfig  # noqa: E402
from schemathesis.core.failures import FailureGroup  # noqa: E402

from framework.engine.loop import Engine  # noqa: E402
from tests.test_server import FIXED, loaded, served  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# Four rows: `n` and `best_of` reach at most 4 in the schema (`schema_as_served`), so no
# drawn request holds more than 4 x MAX_TOKENS tokens of work.
SERVER = [*FIXED, "engine.max_num_seqs=4"]
# The longest answer a fuzzed request asks for: the fuzzer tests the API, not the model's
# length, and a chat without `max_tokens` would otherwise run to the end of the context.
MAX_TOKENS = 4
# Cases drawn per operation and generation mode. The two POST routes carry nearly every
# case (a GET without parameters has one case to draw); 2 routes x 2 modes x 70 bounds the
# run at 280 requests, and the test asserts at least 200 were sent.
EXAMPLES = 70
AT_LEAST = 200
TIMEOUT_S = 30  # one request's read timeout: far above a 4-token answer's


def engine_room(engine: Engine) -> int:
    """The longest prompt + answer the engine could ever serve (as the server's
    `Prompts.room` computes it): past it a request is a 400."""
    room = min(engine.limits.max_model_len, engine.pool.num_blocks * engine.pool.block_size)
    if not engine.cuts_prefills:
        room = min(room, engine.limits.max_num_batched_tokens)
    return room


def _int(value: Any) -> int | None:
    """An integer as the server reads one (pydantic takes 3.0 as 3; JSON's booleans are
    refused), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def bounded(body: Any, chat: bool) -> Any:
    """The body with its answer's length bounded (`max_tokens`, `max_completion_tokens` and
    `min_tokens` at most MAX_TOKENS; a body without a bound gets `max_tokens`: a chat's
    default is the whole context, a completion's 16), so that no case waits on a long
    answer. Only valid integers are lowered, so a body that breaks the schema still
    breaks it."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
        value = _int(body.get(name))
        if value is not None and value > MAX_TOKENS:
            body[name] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS  # JSON's null is no bound either
    return body


class CrossFieldRules:
    """The server's refusals of bodies that fit the schema but break a rule spanning two
    fields, which a JSON schema cannot carry (framework/serve/protocol.py `unsupported`,
    framework/serve/prompts.py `Prompts.beam_width` and `Prompts.spec`, and the engine's
    up-front rejection). `broken_rule` names the rule a body breaks, or None."""

    def __init__(self, tokenizer: Any, room: int) -> None:
        self.tokenizer = tokenizer
        self.room = room

    def prompt_tokens(self, body: dict[str, Any], chat: bool) -> int | None:
        """The prompt's length in tokens as the server counts it; None where the body is not
        one the server would tokenize (it is refused for that before)."""
        try:
            if chat:
                messages = [
                    {"role": m["role"], "content": text_of(m.get("content"))}
                    for m in body["messages"]
                ]
                extra = body.get("chat_template_kwargs") or {}
                out = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, **extra
                )
                ids = out["input_ids"] if hasattr(out, "keys") else out
                return len(ids)
            prompt = body["prompt"]
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
                prompt = prompt[0]
            if isinstance(prompt, str):
                special = body.get("add_special_tokens") is True
                return len(self.tokenizer.encode(prompt, add_special_tokens=special))
            return len(prompt)
        except Exception:  # malformed for the tokenizer: the server refuses it before
            return None

    def broken_rule(self, body: Any, chat: bool) -> str | None:
        if not isinstance(body, dict):
            return None
        n = _int(body.get("n", 1)) or 1
        best_of = None if chat else _int(body.get("best_of"))
        samples = max(n, best_of or 0)
        stream = body.get("stream") is True
        # best_of below n: best_of samples cannot yield n choices
        if best_of is not None and best_of < n:
            return "best_of < n"
        # best_of above n, streamed: the best are known only at the end
        if stream and samples > n:
            return "best_of > n with stream"
        if body.get("use_beam_search") is True:
            # beam search is not streamed: its beams change until the end
            if stream:
                return "use_beam_search with stream"
            # beam search is greedy: a temperature above 0 is refused
            temperature = body.get("temperature", 1.0)
            if isinstance(temperature, int | float) and temperature != 0:
                return "use_beam_search with temperature > 0"
            # beam search ranks the model's own log-probabilities: no penalty, no min_tokens
            neutral = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1}
            if any(body.get(k, v) != v for k, v in neutral.items()) or body.get("min_tokens"):
                return "use_beam_search with a penalty or min_tokens"
            # beam search needs at least 2 beams (best_of, else n)
            if samples < 2:
                return "use_beam_search with fewer than 2 beams"
        max_tokens = _int(body.get("max_tokens"))
        min_tokens = _int(body.get("min_tokens")) or 0
        limit = _int(body.get("max_completion_tokens")) if chat else None
        # min_tokens above max_tokens (or a chat's max_completion_tokens): no answer fits
        if any(m is not None and min_tokens > m for m in (max_tokens, limit)):
            return "min_tokens > max_tokens"
        # the prompt plus max_tokens past the model's context (or the engine's room)
        prompt = self.prompt_tokens(body, chat)
        answer = limit or max_tokens or (1 if chat else 16)  # a completion's default is 16
        if prompt is not None and prompt + answer > self.room:
            return "prompt + max_tokens past the context"
        return None


def text_of(content: Any) -> str:
    """A chat message's text, as the server joins it (`ChatMessage.text`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def test_schemathesis_finds_no_failure(tiny: Any, tmp_path: Any) -> None:
    """Every operation fuzzed with valid and invalid bodies under schemathesis's default
    checks: a schema that tells the truth leaves it nothing to flag. Failures are collected,
    not shrunk, so that one run reports each distinct one; then a good request must still be
    answered and every KV block be back in the pool."""
    _, tok = tiny
    with served(tmp_path, *SERVER, loaded=loaded(tiny)) as s:
        engine = s.running.loop.engine
        rules = CrossFieldRules(tok, engine_room(engine))
        # Reports show the bodies as sent: `max_tokens` is no secret, though its name has "token"
        shown = OutputConfig(sanitization=SanitizationConfig(enabled=False))
        config = schemathesis.Config(seed=0, output=shown)
        schema = schemathesis.openapi.from_url(
            f"{s.url}/openapi.json", config=config, timeout=TIMEOUT_S
        )
        skipped: Counter[str] = Counter()

        @schema.hook
        def map_body(context: Any, body: Any) -> Any:
            """Answers bounded in length (`bounded`)."""
            return bounded(body, context.operation.path.endswith("/chat/completions"))

        @schema.hook
        def filter_case(context: Any, case: Any) -> bool:
            """A body that breaks a cross-field rule is left out (it is a 400 by design,
            checked by `test_each_cross_field_rule_is_refused_by_name`)."""
            chat = case.operation.path.endswith("/chat/completions")
            rule = rules.broken_rule(case.body, chat) if case.method == "POST" else None
            if rule is not None:
                skipped[rule] += 1
            return rule is None

        sent: Counter[str] = Counter()
        failures: dict[str, str] = {}  # a failure's title -> its first report
        session = requests.Session()

        def fuzz(operation: Any, mode: GenerationMode) -> None:
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                # no shrinking: every failure is collected and reported as drawn
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def one(case: Any) -> None:
                sent[f"{operation.label} {mode.value}"] += 1
                try:
                    case.call_and_validate(base_url=s.url, session=session, timeout=TIMEOUT_S)
                except FailureGroup as group:
                    for failure in group.exceptions:
                        failures.setdefault(f"{operation.label}: {failure.title}", str(group))
                except requests.RequestException as error:  # a timeout, a dropped connection
                    failures.setdefault(f"{operation.label}: {type(error).__name__}", str(error))

            one()

        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
                    continue  # no parameter and no body: nothing to break
                fuzz(operation, mode)
        session.close()
        print(f"sent: {dict(sent)}; left out by a cross-field rule: {dict(skipped)}")
        assert not failures, "\n\n".join(failures.values())
        assert sum(sent.values()) >= AT_LEAST, sent

        # After the fuzzing: a good request is answered, and the pool is whole.
        r = httpx.post(
            f"{s.url}/v1/completions",
            json={"prompt": "The capital of France is", "max_tokens": 3, "ignore_eos": True},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        deadline = time.monotonic() + 20  # aborts of cases cut short reach the engine's thread
        while engine.pool.num_used and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.pool.num_used == 0
        assert s.metric("kv_cache_blocks_used") == 0
    # served() stopped the server: its engine's books closed whole (`Engine.finish`)


# One body for each cross-field rule, and the field its 400 names.
CROSS_FIELD = [
    ("/v1/completions", {"n": 2, "best_of": 1}, "best_of"),
    ("/v1/completions", {"best_of": 2, "stream": True}, "best_of"),
    ("/v1/completions", {"use_beam_search": True, "n": 2, "temperature": 0, "stream": True},
     "use_beam_search"),
    ("/v1/completions", {"use_beam_search": True, "n": 2, "temperature": 0.5}, "use_beam_search"),
    ("/v1/chat/completions", {"use_beam_search": True, "temperature": 0}, "use_beam_search"),
    ("/v1/completions", {"use_beam_search": True, "n": 2, "temperature": 0,
                         "presence_penalty": 0.5}, "use_beam_search"),
    ("/v1/completions", {"min_tokens": 3, "max_tokens": 2, "ignore_eos": True}, "min_tokens"),
]  # fmt: skip


def test_each_cross_field_rule_is_refused_by_name(tiny: Any, tmp_path: Any) -> None:
    """Each rule the fuzzing leaves out is a 400 in OpenAI's error body naming the field."""
    with served(tmp_path, *SERVER, loaded=loaded(tiny)) as s:
        room = engine_room(s.running.loop.engine)
        rules = CrossFieldRules(tiny[1], room)
        past = [
            ("/v1/completions", {"max_tokens": room}, "max_tokens"),
            ("/v1/chat/completions", {"max_tokens": room}, "max_tokens"),
        ]
        for route, extra, field in CROSS_FIELD + past:
            chat = route.endswith("chat/completions")
            body = {**({"messages": [{"role": "user", "content": "Hi"}]} if chat else
                       {"prompt": "Hi"}), **extra}  # fmt: skip
            assert rules.broken_rule(body, chat) is not None, body  # the fuzzing leaves it out
            r = httpx.post(f"{s.url}{route}", json=body, timeout=60)
            assert r.status_code == 400, (body, r.text)
            assert r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error", r.text
            assert error["param"] == field, (body, r.text)
            assert field in error["message"], (body, r.text)
        assert s.running.loop.engine.pool.num_used == 0
