"""Deprecated: moved to `framework.api.hookspecs`; plugins import from `framework.api`."""

from framework.api.deprecated import alias

alias(__name__, "framework.api.hookspecs")
