"""nanoserve's OpenAI-compatible HTTP server: `python serve.py scheduler=continuous ...`.

The same Hydra config as `run.py`, plus `server.*` (host, port, queue bound); it listens on
127.0.0.1:8000 by default (`server.port=0`: a free port, printed). Ctrl-C or SIGTERM stops
it gracefully and writes the run folder and the MLflow run as `run.py` does
(docs/server.md).
"""

from __future__ import annotations

import sys

from framework.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
