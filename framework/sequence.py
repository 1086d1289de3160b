"""Deprecated: moved to `framework.engine.sequence`; plugins import from `framework.api`."""

from framework.api.deprecated import alias

alias(__name__, "framework.engine.sequence")
