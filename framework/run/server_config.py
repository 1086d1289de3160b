"""`python serve.py`'s settings (`server.*`): a structured config of the run config, and
its checks, one line naming the field, before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ServerConfig:
    """`python serve.py`: the OpenAI-compatible HTTP server (framework/serve, docs/server.md)."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free port, printed at start
    # Requests queued beyond the running rows at most; past it a request is answered 429.
    # null: no bound.
    max_waiting: int | None = 256
    # The name /v1/models lists and requests may give as `model`; null: the model's own
    # (the folder's name, smollm2, tiny).
    model_name: str | None = None
    # Seconds in-flight requests get to finish after SIGINT / SIGTERM while new ones are
    # answered 503 (a drain); the rest are then aborted. A second signal stops at once.
    shutdown_timeout_s: float = 10.0
    # The server stops by itself (the same drain as on SIGINT) after this many seconds or
    # requests; null:
    # runs until stopped. For tests and bounded benchmarks.
    stop_after_s: float | None = None
    stop_after_requests: int | None = None
    # The key a client must send as `Authorization: Bearer KEY` on every /v1 route, as vLLM's
    # --api-key; else 401. null: the NANOSERVE_API_KEY environment variable, and if that is
    # unset, no key (anyone who reaches the port is served).
    api_key: str | None = None
    # The largest request body accepted, in bytes; a larger one is answered 413 before it
    # is parsed. null: no bound.
    max_body_bytes: int | None = 4_194_304
    # The API's OpenAPI schema at /openapi.json and its page at /docs, as vLLM and SGLang
    # serve them (schema-driven clients and fuzzers start from it); false: neither.
    openapi: bool = True
    # Python's thread switch interval while serving, in ms (its default is 5). It matters
    # where the engine loop runs in a thread (`engine=thread`): that thread gives the GIL up
    # at every torch call, and gets it back only when the HTTP thread lets go, at the latest
    # after this interval. Shorter, the engine waits less behind the streaming of answers:
    # 0.5 ms served a 48-request queue at 0.88x the engine's own speed where 5 ms served it
    # at 0.72x (docs/performance.md).
    switch_interval_ms: float = 0.5
    # Where the engine loop runs. `process`: a process of its own (as vLLM's engine core),
    # fed over a pipe, so it never waits on the HTTP side's interpreter (Python's GIL);
    # it loads the model itself. `thread`: a thread of the server's process, which tests
    # use to look inside the engine and which plugins registered at run time (not through
    # entry points) need, since a spawned process does not see them.
    engine: str = "process"


ENGINE_PLACES = ("process", "thread")


def check_server(s: Any) -> None:
    """The `server.*` settings, named, before the model loads."""
    if str(s.get("engine", "process")) not in ENGINE_PLACES:
        raise ValueError(f"server.engine must be one of {', '.join(ENGINE_PLACES)}; got {s.engine}")
    if not 0 <= s.port <= 65535:
        raise ValueError(f"server.port must be 0 (a free port) to 65535; got {s.port}")
    if s.max_waiting is not None and s.max_waiting < 0:
        raise ValueError(
            f"server.max_waiting must be >= 0, or null (no bound); got {s.max_waiting}"
        )
    if s.max_body_bytes is not None and s.max_body_bytes < 1:
        raise ValueError(
            f"server.max_body_bytes must be >= 1, or null (no bound); got {s.max_body_bytes}"
        )
    if s.api_key is not None and not str(s.api_key).strip():
        raise ValueError("server.api_key must not be empty (null: NANOSERVE_API_KEY, or none)")
    if not s.switch_interval_ms > 0:
        raise ValueError(f"server.switch_interval_ms must be > 0; got {s.switch_interval_ms}")
    if s.shutdown_timeout_s < 0:
        raise ValueError(f"server.shutdown_timeout_s must be >= 0; got {s.shutdown_timeout_s}")
    if s.stop_after_s is not None and not s.stop_after_s > 0:
        raise ValueError(f"server.stop_after_s must be > 0, or null; got {s.stop_after_s}")
    if s.stop_after_requests is not None and s.stop_after_requests < 1:
        raise ValueError(
            f"server.stop_after_requests must be >= 1, or null; got {s.stop_after_requests}"
        )
