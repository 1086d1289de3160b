"""What every request meets first: its arrival stamped, and the API's own refusals made
before its body is parsed."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Protocol

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from framework.serve import errors
from framework.serve.engine_handle import EngineHandle
from framework.serve.errors import ApiError
from framework.serve.metrics import ServerMetrics


class Guarded(Protocol):
    """What the gate reads of the server's state (read only)."""

    @property
    def loop(self) -> EngineHandle: ...
    @property
    def metrics(self) -> ServerMetrics: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def max_body_bytes(self) -> int | None: ...
    @property
    def draining(self) -> Callable[[], bool]: ...


class Gate:
    """What every request meets first, as a plain ASGI middleware: its arrival stamped, and
    the API's own refusals before a body is parsed: a server stopping (503), a missing or
    wrong key (401), a body over `server.max_body_bytes` (413). /health and /metrics stay
    open, for the load balancer and the scraper.

    Plain ASGI, not Starlette's `@app.middleware("http")`: that one runs the app in a task of
    its own and passes every chunk of a streamed answer through a memory stream to the
    server, work on the HTTP side for each token of each stream, on the cores the engine
    computes on."""

    def __init__(self, app: ASGIApp, state: Guarded) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # A request arrives when its headers do, before its body is read and parsed: the
        # server's own TTFT then covers all the server did for it.
        scope.setdefault("state", {})["received"] = self.state.loop.elapsed()
        if scope["path"].startswith("/v1/"):
            if self.state.draining():
                self.state.metrics.refuse(503)
                await shutting_down()(scope, receive, send)
                return
            refused, body = await refusal(self.state, Request(scope), receive)
            if refused is not None:
                await errors.error_response(refused)(scope, receive, send)
                return
            if body is not None:  # read to measure it: the app reads it again from here
                receive = replay(body, receive)
        await self.app(scope, receive, send)


def replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body already read given back first, as one message."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def refusal(
    state: Guarded, request: Request, receive: Receive
) -> tuple[ApiError | None, bytes | None]:
    """Why the server refuses `request` before reading it as an API call, if it does; and
    its body, where it had to be read to know its size (no `Content-Length`)."""
    if state.api_key is not None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
            error = ApiError(
                401,
                "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )
            return error, None
    limit = state.max_body_bytes
    if limit is None or request.method != "POST":
        return None, None
    length = request.headers.get("content-length")
    body = None
    if length is not None and length.isdigit():
        size = int(length)
    else:
        body = await read_body(receive)
        size = len(body)
    if size > limit:
        return ApiError(
            413,
            f"the request body is {size} bytes; this server accepts at most {limit} "
            "(server.max_body_bytes)",
        ), body
    return None, body


async def read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: what came is all there is
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def shutting_down() -> Response:
    """The answer of a server that is stopping: 503 in OpenAI's schema, and `Retry-After`
    so that a client (the `openai` package retries 503s) tries again in a second, when a
    load balancer has sent it to another replica."""
    response = errors.error_response(
        ApiError(503, "the server is shutting down: it takes no new request")
    )
    response.headers["Retry-After"] = "1"
    return response
