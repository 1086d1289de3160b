"""Deprecated alias: `framework.policy` moved to `framework.api.policy`; plugins import from
`framework.api`. Plugins written before the move still load through this alias (the policy API
version stays 1: nothing was removed or changed meaning); it goes in a later release.
"""

import importlib
import sys
import warnings

warnings.warn(
    "framework.policy is deprecated; import from framework.api instead",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("framework.api.policy")
