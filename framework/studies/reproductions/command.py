"""`python -m experiments.reproduce NAME [--out DIR] [--quick] [--workers N] [OVERRIDES]`:
one paper's published result reproduced on the simulated executor, and its report written
(`report.py`); `--list` names every reproduction with its paper and figure. A mistake (an
unknown name, a bad flag, a bad override) is one `error:` line and exit status 2."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from framework.run.errors import UserError
from framework.run.paths import OUTPUTS
from framework.studies.reproductions import report
from framework.studies.reproductions.registry import REPRODUCTIONS, entry
from framework.studies.reproductions.reproduction import Context
from framework.tracking.tool_run import command_line

# Jobs at once by default: this machine's cores (forked workers), at most this many, since
# each whole-trace job holds gigabytes of its own.
DEFAULT_WORKERS = 2


def refuse(message: str) -> NoReturn:
    """argparse's errors as one line (its own print a usage block first)."""
    raise UserError(f"{message}; python -m experiments.reproduce --help lists the arguments")


def workers_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers must be a whole number; got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--workers must be >= 1; got {value}")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.error = refuse  # type: ignore[method-assign]
    ap.add_argument("name", nargs="?", help="the reproduction (--list names them)")
    ap.add_argument("--list", action="store_true", help="name every reproduction and exit")
    ap.add_argument("--quick", action="store_true", help="the small form, in seconds")
    ap.add_argument(
        "--out", type=Path, help="where the report goes (outputs/reproductions/NAME/DATE_TIME)"
    )
    ap.add_argument(
        "--workers",
        type=workers_count,
        default=DEFAULT_WORKERS,
        help=f"runs at once, in forked processes ({DEFAULT_WORKERS}; 1: in this process)",
    )
    ap.add_argument(
        "overrides", nargs="*", help="Hydra overrides of run.py, applied to every run it makes"
    )
    args = ap.parse_intermixed_args(argv)
    if not args.list and args.name is None:
        refuse("name a reproduction")
    return args


def list_text() -> str:
    width = max(len(n) for n in REPRODUCTIONS)
    return "\n".join(f"{e.name:<{width}}  {e.paper}: {e.figure}" for e in REPRODUCTIONS.values())


def default_out(name: str) -> Path:
    return OUTPUTS / "reproductions" / name / time.strftime("%Y-%m-%d_%H-%M-%S")


def reproduce(argv: list[str] | None = None) -> Path | None:
    """Run the command; the report's folder (None for `--list`)."""
    args = parse(argv)
    if args.list:
        print(list_text())
        return None
    found = entry(args.name)
    out = args.out if args.out is not None else default_out(found.name)
    ctx = Context(found.name, args.quick, list(args.overrides), out, args.workers)
    outcome = found.load()(ctx)
    files = report.write(found, ctx, outcome, command_line("reproduce", argv), args)
    print(files[0].read_text())
    print(f"wrote {', '.join(str(f) for f in files)}")
    return out


def main(argv: list[str] | None = None) -> int:
    """0 when the reproduction ran, 2 with one `error:` line for a user's mistake."""
    try:
        reproduce(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
