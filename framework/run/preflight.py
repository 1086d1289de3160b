"""Command-line checks that run before Hydra composes (and before any model is imported).

Hydra's own error for `scheduler=fifo` lists the group's options but not who provides them,
and it comes after seconds of imports. Here the policy-group overrides are parsed with
Hydra's own parsers (so `+scheduler=x`, `scheduler@pkg=x` and `-m` sweeps such as
`scheduler=static,fifo` are read exactly as Hydra reads them) and checked against the
registry; an unknown name fails at once, listing every group's policies with the
distribution providing each. Anything this module cannot read is left to Hydra.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hydra._internal.utils import get_args_parser  # Hydra's CLI parser; no public equivalent
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, IntervalSweep
from hydra.errors import HydraException

from framework.api.groups import GROUPS
from framework.plugin_host.registry import Registry
from framework.run.errors import UserError


def command_line_overrides(argv: Sequence[str]) -> list[str]:
    """The overrides of a `run.py` command line, flags (`-m`, `--cfg job`, ...) removed."""
    args, _ = get_args_parser().parse_known_args(list(argv))
    return list(args.overrides or [])


def policy_choices(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """(group, name) for every policy an override selects, sweeps expanded.

    Globs (`scheduler=glob(*)`) are skipped: Hydra expands them against the registered
    options, so they cannot name an unknown one. Unparsable overrides and interpolations are
    skipped too, for Hydra to report or resolve in its own words.
    """
    parser = OverridesParser.create()
    chosen: list[tuple[str, str]] = []
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except HydraException:
            continue
        group = override.key_or_group
        if group not in GROUPS or override.is_delete():
            continue
        value = override.value()
        if isinstance(value, Glob | IntervalSweep):  # expanded or rejected by Hydra itself
            continue
        if override.is_sweep_override():  # a,b / choice(a,b) / range(...)
            names = list(override.sweep_string_iterator())
        else:
            values = value if isinstance(value, list) else [value]
            names = [str(v) for v in values if v is not None]
        # An interpolation (`${...}`) is resolved later, by Hydra.
        chosen += [(group, name) for name in names if "${" not in name]
    return chosen


def unknown_policies(argv: Sequence[str], reg: Registry) -> list[tuple[str, str]]:
    """The (group, name) choices on a command line that no loaded plugin registers."""
    chosen = policy_choices(command_line_overrides(argv))
    return [(g, n) for g, n in chosen if n not in reg.policies[g]]


def check_command_line(argv: Sequence[str], reg: Registry) -> None:
    """Refuse, in one line, a command line that names an unknown policy: the name, and what
    its group offers with the distribution providing each."""
    unknown = unknown_policies(argv, reg)
    if unknown:
        raise UserError(reg.unknown_line(unknown))
