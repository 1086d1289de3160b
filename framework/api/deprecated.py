"""Old import paths kept as aliases of their new modules, for plugins written before the
framework was grouped by job. The policy API version stays 1: nothing was removed or changed
meaning, only moved. The aliases go in a later release; import from `framework.api`."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make module `old` the very module `new` (same classes, so `isinstance` and
    registration work across both names), with a DeprecationWarning for the importer."""
    warnings.warn(
        f"{old} is deprecated (moved to {new}); import from framework.api instead",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
