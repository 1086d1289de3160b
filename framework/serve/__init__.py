"""The OpenAI-compatible HTTP server (`python serve.py`): real clients and load generators
drive the engine online, one engine loop in its own thread (docs/server.md)."""
