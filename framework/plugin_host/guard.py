"""Names the plugin when a policy raises.

A third-party policy that crashes inside `admit` should produce
`PolicyError: scheduler policy 'sjf' (my-dist) raised in admit: ZeroDivisionError(...)`,
not a bare traceback into someone else's package.
"""

from __future__ import annotations

import functools
from typing import Any, Generic, TypeVar

from framework.api.policy import PolicyError

P = TypeVar("P")


class Guarded(Generic[P]):
    """Wraps a policy object; every method call re-raises a crash as a named PolicyError.
    Typed by the policy it wraps (`Guarded[Allocator]`), so a caller knows what it holds."""

    def __init__(self, policy: P, group: str, name: str, provider: str | None) -> None:
        self._policy = policy
        self._label = f"{group} policy {name!r}" + (f" ({provider})" if provider else "")

    def unguarded(self, attr: str) -> Any:
        """The policy's own method, for a caller that guards a loop of calls at once with
        `failure` (a per-call wrapper for every row of every step is measurable)."""
        return getattr(self._policy, attr)

    def failure(self, attr: str, exc: Exception) -> PolicyError:
        """The error a crash in `attr` is re-raised as."""
        return PolicyError(f"{self._label} raised in {attr}: {exc!r}")

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._policy, attr)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except PolicyError:
                raise
            except Exception as exc:
                raise self.failure(attr, exc) from exc

        # Kept: the engine calls a policy's methods several times a step, and wrapping anew
        # each time was a measurable share of its host work. (Attributes that are not
        # methods are read through every time: a policy may change them.)
        self.__dict__[attr] = call
        return call
