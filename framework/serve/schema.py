"""The API's OpenAPI schema as the server answers it (`/openapi.json`, docs/server.md)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

# A generation route's 200: the whole answer in JSON, or (`stream: true`) server-sent events.
# Before OpenAPI 3.2 (`itemSchema`), an event stream's `schema` describes one event, as a
# client parses it: its `data` a chunk's JSON, `[DONE]` the last.
ANSWERED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the answer as JSON, or with `stream: true` as server-sent events",
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "description": "one event: `data` a chunk's JSON, or `[DONE]` last",
                    "properties": {
                        "data": {"type": "string"},
                        "event": {"type": "string"},
                        "id": {"type": "string"},
                        "retry": {"type": "integer"},
                    },
                    "required": ["data"],
                }
            }
        },
    }
}


def schema_as_served(app: FastAPI, vocab_size: int, max_num_seqs: int) -> None:
    """The schema as this server answers: FastAPI documents a 422 for every body, which this
    server answers as a 400 in OpenAI's error body (`ERRORS`), so the 422s go; and the
    bounds only the loaded model and engine know go in: a token id within the vocabulary
    (0 up to its size, as the server checks prompt and stop token ids), `n` and `best_of`
    within `engine.max_num_seqs`."""
    made = app.openapi
    vocab = vocab_size - 1
    rows = max_num_seqs

    def bound(node: Any) -> None:
        """Every integer item of a token-id list gets the vocabulary's bounds."""
        if isinstance(node, dict):
            if node.get("type") == "array" and node.get("items", {}).get("type") == "integer":
                node["items"]["minimum"] = 0
                node["items"]["maximum"] = vocab
            for value in node.values():
                bound(value)
        elif isinstance(node, list):
            for value in node:
                bound(value)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = made()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name, model in schema.get("components", {}).get("schemas", {}).items():
                props = model.get("properties", {})
                if name in ("CompletionRequest", "ChatRequest"):
                    bound(props.get("prompt", {}))
                    bound(props.get("stop_token_ids", {}))
                    for field in ("n", "best_of"):
                        for kind in props.get(field, {}).get("anyOf", [props.get(field, {})]):
                            if kind.get("type") == "integer":
                                kind["maximum"] = rows
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
