"""Deprecated alias: `framework.sequence` moved to `framework.engine.sequence`; plugins import from
`framework.api`. Plugins written before the move still load through this alias (the policy API
version stays 1: nothing was removed or changed meaning); it goes in a later release.
"""

import importlib
import sys
import warnings

warnings.warn(
    "framework.sequence is deprecated; import from framework.api instead",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("framework.engine.sequence")
