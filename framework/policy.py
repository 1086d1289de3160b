"""Deprecated: moved to `framework.api.policy`; plugins import from `framework.api`."""

from framework.api.deprecated import alias

alias(__name__, "framework.api.policy")
