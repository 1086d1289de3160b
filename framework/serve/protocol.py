"""The request bodies the server accepts (OpenAI's, and vLLM's `ignore_eos`, `top_k` and
`stop_token_ids`), as pydantic models that refuse unknown fields by name, and the response
bodies it sends."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from framework.core.request import NEUTRAL_PENALTIES


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM's: usage on every chunk


def _has_boolean(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_boolean(v) for v in value)
    return isinstance(value, bool)


class SamplingFields(BaseModel):
    """What both endpoints accept. Fields OpenAI defines that this server cannot honour
    (`logit_bias`, `suffix`) are accepted only at their neutral value (the schema says so),
    and refused otherwise. A
    boolean is no number (`no_booleans`), as the schema says."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def no_booleans(cls, data: Any) -> Any:
        """JSON's `true` and `false` only where a field is a boolean: pydantic would read
        them as 1 and 0 in a number's place, which the schema does not allow."""
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if field is None or any(k in str(field.annotation) for k in ("bool", "Literal")):
                continue
            if _has_boolean(value):
                raise ValueError(f"{name} takes no boolean")
        return data

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # vLLM's; 0 or -1: no top-k cut
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's
    n: int = Field(default=1, ge=1)  # choices: parallel samples over one prompt's KV
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False  # vLLM's: exactly max_tokens tokens
    # vLLM's beam search: `best_of` (else `n`) beams, greedy, the best `n` returned
    use_beam_search: StrictBool = False
    length_penalty: float = 1.0
    # vLLM's other sampling fields (its benchmarks and load generators send them)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    min_tokens: int = Field(default=0, ge=0)  # no stop token, nor stop string, before
    repetition_penalty: float = Field(default=1.0, gt=0.0)  # on prompt and output tokens
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: Literal[True] = True
    include_stop_str_in_output: StrictBool = False
    user: str | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0)

    def unsupported(self) -> tuple[str, str] | None:
        """(field, why) for a value this server does not serve, else None."""
        if self.min_tokens and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            return "min_tokens", f"min_tokens={self.min_tokens} is above max_tokens"
        return None

    def scoring(self) -> tuple[int | None, int | None]:
        """(alternatives scored per output token, per prompt token); None: not scored."""
        return None, None

    def shaping(self) -> str | None:
        """The first field that changes the logits before the draw (a penalty, min_tokens),
        else None: each needs the model's logits, and none goes with beam search."""
        for name, value in NEUTRAL_PENALTIES.items():
            if getattr(self, name) != value:
                return name
        return "min_tokens" if self.min_tokens else None

    @property
    def samples(self) -> int:
        """The samples the engine runs for it."""
        return self.n

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


# The most alternatives a token's log-probabilities list (vLLM's default `max_logprobs`).
MAX_LOGPROBS = 20


# A prompt that is not empty: text, token ids, or (OpenAI's batch form) a list of either,
# of which this server serves one.
Text = Annotated[str, Field(min_length=1)]
Ids = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Prompt = (
    Text
    | Ids
    | Annotated[list[Text], Field(min_length=1, max_length=1)]
    | Annotated[list[Ids], Field(min_length=1, max_length=1)]
)


class CompletionRequest(SamplingFields):
    prompt: Prompt
    add_special_tokens: StrictBool = False  # a text prompt's: the tokenizer's BOS and such
    echo: StrictBool = False  # the prompt before the answer (with its logprobs, if asked)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Samples run, of which the `n` with the highest mean log-probability per token return
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = Field(default=None, max_length=0)  # not served: none

    @property
    def samples(self) -> int:
        """The samples run: `best_of` of them (the `n` best returned), else `n`."""
        return max(self.n, self.best_of or 0)

    def scoring(self) -> tuple[int | None, int | None]:
        return self.logprobs, self.logprobs if self.echo else None

    def unsupported(self) -> tuple[str, str] | None:
        if self.best_of is not None and self.best_of < self.n:
            return "best_of", f"best_of={self.best_of} is below n={self.n}: it must be >= n"
        if self.stream and self.samples > self.n:
            return "best_of", "best_of above n cannot be streamed (the best are known at the end)"
        return super().unsupported()


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    add_special_tokens: StrictBool = False  # on top of the chat template's own
    chat_template_kwargs: dict[str, Any] | None = None  # to the tokenizer's chat template
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def scoring(self) -> tuple[int | None, int | None]:
        """`top_logprobs` counts only with `logprobs: true` (alone, nothing is scored)."""
        return (self.top_logprobs or 0) if self.logprobs else None, None

    def unsupported(self) -> tuple[str, str] | None:
        return super().unsupported()


# ---- responses ------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body, which every refusal of this server has."""

    error: ErrorDetail


# What the API's routes answer besides 200, in its schema (`/openapi.json`): each in OpenAI's
# error body. A malformed body is a 400 naming the field, never FastAPI's 422.
REFUSALS = {
    400: "a malformed body, or a value not served (the message names the field)",
    401: "a missing or wrong API key (server.api_key)",
    404: "a model this server does not serve",
    413: "a body over server.max_body_bytes",
    429: "more requests waiting than server.max_waiting",
    500: "the engine loop stopped on a bug",
    503: "the server is stopping",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": why} for status, why in REFUSALS.items()
}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    rid: str,
    model: str,
    answers: list[tuple[str, str | None, dict[str, Any] | None]],
    use: dict[str, int] | None,
    chat: bool,
) -> dict[str, Any]:
    """A whole answer (`stream=false`): one choice for each (text, finish, logprobs) in
    `answers`."""
    choices: list[dict[str, Any]] = []
    for index, (text, finish, logprobs) in enumerate(answers):
        if chat:
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        choices.append(choice)
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": use,
    }


def chunk_body(
    rid: str,
    model: str,
    created: int,
    chat: bool,
    text: str | None,
    finish: str | None,
    role: bool = False,
    use: dict[str, int] | None = None,
    with_usage: bool = False,
    choices: bool = True,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One server-sent event of a stream: a piece of choice `index`'s text, its finish, or
    (no choices) the usage chunk that `stream_options.include_usage` asks for last."""
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
    }
    if choices:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs}
        choice["finish_reason"] = finish
        body["choices"] = [choice]
    if with_usage:
        body["usage"] = use
    return body
