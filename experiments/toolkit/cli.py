"""The command-line arguments the tools have in common, each spelled once, so a similar
argument reads the same in every tool (`--rounds`, `--out`, `--threads`, `--quick`,
`--json`, `--hardware`, the Azure slice's sizes, the trailing Hydra overrides)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from framework.run.paths import DEFAULT_TRACE


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A tool's parser, described by its module docstring's first paragraph."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0] or None)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def comma_list(allowed: Iterable[str] | None = None) -> Callable[[str], list[str]]:
    """An argument type: a comma-separated list of names, each among `allowed` when given."""
    choices = tuple(allowed) if allowed is not None else None

    def split(text: str) -> list[str]:
        got = [x for x in text.split(",") if x]
        bad = [x for x in got if choices and x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]!r}: choose from {', '.join(choices)}")
        return got

    return split


def add_overrides(ap: argparse.ArgumentParser, help: str = "Hydra overrides of the run config"):
    ap.add_argument("overrides", nargs="*", help=help)


def add_out(ap: argparse.ArgumentParser, default: Path | None, help: str | None = None) -> None:
    ap.add_argument("--out", type=Path, default=default, help=help)


def add_rounds(ap: argparse.ArgumentParser, default: int | None, help: str) -> None:
    """`--rounds`: how many times the timed runs go round, the order alternating from one
    round to the next where a tool compares several."""
    ap.add_argument("--rounds", type=positive_int, default=default, help=help)


def add_threads(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def add_quick(ap: argparse.ArgumentParser, help: str = "the tiny model") -> None:
    ap.add_argument("--quick", action="store_true", help=help)


def add_json(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")


def add_hardware(ap: argparse.ArgumentParser, help: str = "") -> None:
    ap.add_argument(
        "--hardware", required=True, help=help or "a shipped spec's name or a spec file"
    )


def add_interconnect(ap: argparse.ArgumentParser, help: str) -> None:
    ap.add_argument("--interconnect", default="dgx", help=help)


def add_azure_slice(ap: argparse.ArgumentParser) -> None:
    """The queued Azure slice's sizes (`toolkit.workloads.azure_specs`); their defaults come
    from the tool's full or quick sizes (`fill_sizes`)."""
    ap.add_argument("--requests", type=int, help="Azure slice: first N rows (24; quick 6)")
    ap.add_argument("--max-prompt", type=int, help="prompt tokens cap (128; quick 24)")
    ap.add_argument("--max-output", type=int, help="output tokens cap (32; quick 8)")
    ap.add_argument("--fit", choices=("scale", "clamp"), default="scale")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)


def fill_sizes(args: argparse.Namespace, full: dict[str, Any], quick: dict[str, Any]) -> None:
    """Every size left unset on the command line, from `quick` under `--quick`, else `full`."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def run_overrides(args: argparse.Namespace, base: Iterable[str] = ()) -> list[str]:
    """The tool's own settings, then the tiny model under `--quick`, then the user's."""
    return [*base, *(["model=tiny"] if args.quick else []), *args.overrides]
