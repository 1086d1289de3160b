"""`python serve.py OVERRIDES...`: the HTTP server under the same Hydra config as `run.py`,
with the same exit statuses (0; 2 and one `error:` line for a user's mistake; 1 for a bug)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-m", "--multirun") or a.startswith("hydra/launcher=") for a in args):
        print("error: serve.py serves one run; -m (a sweep) is for run.py", file=sys.stderr)
        return 2
    try:
        from framework.serve.server import serve_http
    except ImportError as exc:  # fastapi / uvicorn: the `serve` extra
        print(
            f"error: serve.py needs the serve extra ({exc.name} is missing): "
            "pip install -e '.[serve]'",
            file=sys.stderr,
        )
        return 2
    from framework.run.cli import main as run_main

    # The job, and so its log in the run folder, is named after the command (serve.log); an
    # override the user gives still wins.
    return run_main(["hydra.job.name=serve", *args], serve_http)
