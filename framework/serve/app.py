"""The HTTP routes: OpenAI's `/v1/models`, `/v1/completions`, `/v1/chat/completions`, and
`/health`, `/metrics`. A handler turns its body into a request, hands it to the engine loop,
and answers from the events the loop sends back: all at once, or as server-sent events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from framework.core.sequence import STOP_STRING
from framework.serve import errors
from framework.serve.engine_handle import EngineHandle
from framework.serve.engine_loop import Event, Stream
from framework.serve.errors import ApiError
from framework.serve.gate import Gate, shutting_down
from framework.serve.logprobs import Logprobs, joined
from framework.serve.metrics import CONTENT_TYPE, ServerMetrics
from framework.serve.prompts import Prompts
from framework.serve.protocol import (
    ERRORS,
    ChatRequest,
    CompletionRequest,
    SamplingFields,
    chunk_body,
    completion_body,
    usage,
)
from framework.serve.schema import ANSWERED, schema_as_served
from framework.serve.text import TextStream

# The engine's finish reasons as OpenAI's: a stop string is a stop; an abort (the server
# shutting down under a request) keeps its own name.
FINISH = {"stop": "stop", "length": "length", STOP_STRING: "stop", "abort": "abort"}


@dataclass
class ServerState:
    loop: EngineHandle
    prompts: Prompts
    tokenizer: Any
    model_name: str
    max_waiting: int | None
    metrics: ServerMetrics
    describe: dict[str, Any]  # what serves: executor, cost model, profile, policies
    max_model_len: int
    api_key: str | None = None  # the Bearer key every /v1 route asks for (None: none)
    max_body_bytes: int | None = None  # the largest body accepted (None: no bound)
    openapi: bool = True  # /openapi.json and /docs served
    on_request_done: Callable[[], None] = lambda: None
    draining: Callable[[], bool] = lambda: False  # stopping: new requests are answered 503
    created: int = field(default_factory=lambda: int(time.time()))


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(
        title="nanoserve",
        summary="OpenAI-compatible completions and chat over nanoserve's engine",
        docs_url="/docs" if state.openapi else None,
        redoc_url=None,
        openapi_url="/openapi.json" if state.openapi else None,
    )
    errors.install(app)
    schema_as_served(app, state.prompts.vocab, state.prompts.facts.max_num_seqs)

    app.add_middleware(Gate, state=state)

    @app.get("/health", response_class=PlainTextResponse, responses={503: ERRORS[503]})
    async def health() -> Response:
        """503 from the moment the server starts to stop, so that a load balancer sends
        nothing more here while in-flight requests finish."""
        if state.draining():
            return shutting_down()
        if not state.loop.alive():
            return errors.error_response(ApiError(503, "the engine loop has stopped"))
        return PlainTextResponse("ok")

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", responses={k: ERRORS[k] for k in (401, 503)})
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "nanoserve",
                    "root": state.model_name,
                    "parent": None,
                    "max_model_len": state.max_model_len,
                    "nanoserve": state.describe,
                }
            ],
        }

    @app.post("/v1/completions", responses={**ANSWERED, **ERRORS})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generate(state, body, state.prompts.completion(body), False, request)

    @app.post("/v1/chat/completions", responses={**ANSWERED, **ERRORS})
    async def chat(body: ChatRequest, request: Request) -> Response:
        return await generate(state, body, state.prompts.chat(body), True, request)

    return app


async def generate(
    state: ServerState, body: SamplingFields, ids: list[int], chat: bool, request: Request
) -> Response:
    if body.model is not None and body.model != state.model_name:
        raise ApiError(
            404,
            f"the model {body.model!r} does not exist; this server serves {state.model_name!r}",
            "model",
            "model_not_found",
        )
    spec = state.prompts.spec(body, ids, "chat" if chat else "completion")
    loop = state.loop
    # One read: the engine's thread moves the count meanwhile, and the message must give
    # the number the refusal was decided on.
    waiting = loop.waiting()
    if state.max_waiting is not None and waiting >= state.max_waiting:
        state.metrics.refuse(429)
        raise ApiError(
            429,
            f"{waiting} requests are waiting, the bound (server.max_waiting) is "
            f"{state.max_waiting}: try again later",
        )
    received = getattr(request.state, "received", None)
    stream = Stream(spec, asyncio.get_running_loop(), received or loop.elapsed())
    loop.submit(stream)
    first = await stream.events.get()
    if first.rejected is not None:
        if loop.closing:
            state.metrics.refuse(503)
            return shutting_down()
        state.metrics.refuse(400)
        raise ApiError(
            400, f"this request can never be served here: {first.rejected}", "max_tokens"
        )
    if first.error is not None:
        raise ApiError(500, first.error)
    answer = Answer(state, stream, body, chat)
    if body.stream:
        return StreamingResponse(
            answer.events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await answer.whole(request)


class Answer:
    """One request's answer from its stream of events: a choice for each of its samples
    (`n`), each with its own text and finish."""

    def __init__(self, state: ServerState, stream: Stream, body: SamplingFields, chat: bool):
        self.state = state
        self.stream = stream
        self.body = body
        self.chat = chat
        sp = stream.spec.sampling
        n = sp.sequences  # its samples, or its beams
        self.texts = [
            TextStream(
                state.tokenizer, body.stops(), body.skip_special_tokens,
                body.include_stop_str_in_output, body.min_tokens,
            )
            for _ in range(n)
        ]  # fmt: skip
        self.received = [0] * n  # tokens the engine released to each choice
        self.finishes: list[str | None] = [None] * n
        self.prompt_tokens = len(stream.spec.prompt_token_ids)
        self.started = [False] * n  # a choice's first event seen (an echo goes before it)
        self.echo = echo_text(state.tokenizer, body, stream.spec.prompt_token_ids)
        self.scored = sp.logprobs is not None
        self.shown = body.scoring()[0] is not None  # asked for: else only ranked by them
        # each choice's log-probability over its tokens, and its tokens, for `best_of`
        self.sums = [0.0] * n
        self.shapes = [Logprobs(state.tokenizer, chat) for _ in range(n)]

    @property
    def completion_tokens(self) -> int:
        return sum(
            t.tokens if t.stopped else r for t, r in zip(self.texts, self.received, strict=True)
        )

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finishes)

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, self.completion_tokens)

    def take(self, event: Event) -> tuple[int, str, str | None, dict[str, Any] | None]:
        """An event's choice, its new text (after the echoed prompt, on a choice's first),
        the choice's finish reason once it has one, and its tokens' log-probabilities where
        they were asked for (the prompt's first, when echoed)."""
        if event.error is not None:
            raise RuntimeError(event.error)
        i = event.index
        if self.finishes[i] is not None:  # a stop string ended it; the engine's end follows
            return i, "", None, None
        shapes: list[dict[str, Any]] = []
        echo = ""
        if not self.started[i]:
            self.started[i] = True
            if self.echo is not None:
                echo = self.echo
                prompt = self.stream.spec.prompt_token_ids
                if event.prompt_logprobs is not None:
                    book = event.prompt_logprobs + [None] * len(prompt)
                    shapes.append(self.shapes[i].add(prompt, book[: len(prompt)]))
        self.received[i] += len(event.tokens)
        text = self.texts[i]
        before = text.tokens
        piece = text.add(event.tokens)
        if self.scored:  # the tokens the text kept (up to a stop string's last)
            kept = text.tokens - before
            entries = event.logprobs[:kept]
            self.sums[i] += sum(e.logprob for e in entries if e is not None)
            if self.shown:
                shapes.append(self.shapes[i].add(event.tokens[:kept], entries))
        if text.stopped:
            if event.finish is None:  # the engine goes on until told: it is told now
                self.state.loop.abort(self.stream, STOP_STRING, index=i)
            self.finishes[i] = "stop"
        elif event.finish is not None:
            piece += text.finish()
            self.finishes[i] = FINISH.get(event.finish, event.finish)
        return i, echo + piece, self.finishes[i], joined(shapes, self.chat)

    async def whole(self, request: Request) -> Response:
        """Wait for the whole answer, or abort it if the client goes away first."""
        collect = asyncio.ensure_future(self._collect())
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not collect.done():
            collect.cancel()
            self.state.loop.abort(self.stream)
            self.state.on_request_done()
            return Response(status_code=499)
        self.state.on_request_done()
        try:
            answers = collect.result()
        except RuntimeError as error:
            return errors.error_response(ApiError(500, str(error)))
        s = self.stream.spec
        n = self.body.n
        if s.sampling.beam_width > 1:  # beams: the best first
            answers = answers[:n]
        elif len(answers) > n:  # best_of: the n with the highest log-probability per token
            mean = [t / max(1, x.tokens) for t, x in zip(self.sums, self.texts, strict=True)]
            best = sorted(range(len(answers)), key=lambda i: -mean[i])[:n]
            answers = [answers[i] for i in best]  # the best first
        return JSONResponse(
            completion_body(s.id, self.state.model_name, answers, self.usage(), self.chat)
        )

    async def _collect(self) -> list[tuple[str, str | None, dict[str, Any] | None]]:
        parts: list[list[str]] = [[] for _ in self.texts]
        scores: list[list[dict[str, Any]]] = [[] for _ in self.texts]
        while not self.done:
            i, piece, _, shape = self.take(await self.stream.events.get())
            parts[i].append(piece)
            if shape is not None:
                scores[i].append(shape)
        return [
            ("".join(p), f, joined(lp, self.chat) if self.shown else None)
            for p, f, lp in zip(parts, self.finishes, scores, strict=True)
        ]

    async def events(self) -> AsyncIterator[str]:
        """The answer as server-sent events, `data: [DONE]` last; each chunk carries its
        choice's index, as OpenAI's do for n > 1. A client that goes away mid-stream cancels
        this generator: its request is aborted."""
        s = self.stream.spec
        model, chat = self.state.model_name, self.chat
        opts = self.body.stream_options
        include_usage = opts is not None and opts.include_usage
        every = opts is not None and opts.continuous_usage_stats
        created = int(time.time())
        complete = False

        def chunk(
            index: int,
            text: str | None,
            finish: str | None,
            role: bool = False,
            logprobs: dict[str, Any] | None = None,
        ) -> str:
            body = chunk_body(
                s.id,
                model,
                created,
                chat,
                text,
                finish,
                role,
                self.usage() if every else None,
                include_usage,
                index=index,
                logprobs=logprobs,
            )
            return sse(body)

        try:
            if chat:
                for i in range(len(self.texts)):
                    yield chunk(i, "", None, role=True)
            while not self.done:
                try:
                    i, piece, finish, shape = self.take(await self.stream.events.get())
                except RuntimeError as error:
                    yield sse(errors.error_body(500, str(error)))
                    break
                if piece or finish is not None or shape is not None:
                    yield chunk(i, piece, finish, logprobs=shape)
            if include_usage:
                yield sse(
                    chunk_body(
                        s.id,
                        model,
                        created,
                        chat,
                        None,
                        None,
                        use=self.usage(),
                        with_usage=True,
                        choices=False,
                    )
                )
            yield "data: [DONE]\n\n"
            complete = True
        finally:
            if not complete:
                self.state.loop.abort(self.stream)
            self.state.on_request_done()


def echo_text(tokenizer: Any, body: SamplingFields, ids: list[int]) -> str | None:
    """The prompt as a completion with `echo` repeats it: its own text where it came as
    text, else its tokens decoded; None where it is not echoed."""
    if not isinstance(body, CompletionRequest) or not body.echo:
        return None
    prompt = body.prompt[0] if isinstance(body.prompt, list) and body.prompt else body.prompt
    if isinstance(prompt, str):
        return prompt
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


async def disconnected(request: Request) -> None:
    """Returns when the client has gone away (after the body, uvicorn's `receive` waits
    for the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
