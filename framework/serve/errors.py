"""Errors in OpenAI's schema, `{"error": {"message", "type", "param", "code"}}`, so that any
OpenAI client reads them; every bad request gets one and the server keeps serving."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

# HTTP status -> OpenAI's error type
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    411: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A request the server refuses: its status, message, and the parameter at fault."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None):
    """The body of an error response (a dict; a stream's error event carries it too)."""
    return {
        "error": {
            "message": message,
            "type": TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(error.status, error.message, error.param, error.code), status_code=error.status
    )


def validation_message(errors: list[Any]) -> tuple[str, str | None]:
    """Pydantic's first complaint as one sentence naming the field (and what it accepts),
    and the field's dotted name for `param`."""
    if not errors:
        return "the request body is not valid", None
    e = errors[0]
    # A union (a prompt's forms) fails once per form: the form that failed on its value
    # says more than those of another type ("at most 1 item" over "not a string").
    same = [x for x in errors if x.get("loc", ())[:2] == e.get("loc", ())[:2]]
    specific = [x for x in same if not str(x.get("type", "")).endswith("_type")]
    if len(same) > 1 and specific:  # a length bound first: it names what is wrong
        e = min(specific, key=lambda x: "too_" not in str(x.get("type", "")))
    # the field's path, without pydantic's names for the union's members ("constrained-str")
    loc = [
        str(part)
        for part in e.get("loc", ())
        if part != "body" and not any(c in str(part) for c in "-[")
    ]
    param = ".".join(loc) or None
    kind = e.get("type", "")
    if kind == "extra_forbidden":
        return f"unknown field {param!r}: this server does not accept it", param
    if kind == "json_invalid":
        return f"the body is not valid JSON ({e.get('msg', '')})", None
    if kind == "missing" and param is None:  # the whole body
        return "the request has no body: send a JSON object", None
    if kind == "missing":
        return f"{param!r} is required", param
    where = f"{param!r}: " if param else ""
    return f"{where}{e.get('msg', 'invalid value')}", param


def install(app: FastAPI) -> None:
    """Every refusal the app can make, in OpenAI's schema: a validation error (FastAPI's
    422) is a 400 naming the field, as OpenAI answers it."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return error_response(ApiError(400, message, param))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        response = error_response(ApiError(exc.status_code, str(exc.detail)))
        response.headers.update(exc.headers or {})  # a 405's `Allow` (RFC 9110)
        return response
