"""Frozen dataclasses made on the hot path without their generated `__init__`.

A frozen dataclass's `__init__` sets each field through `object.__setattr__` (frozen classes
refuse plain assignment), several times slower than filling the new instance's `__dict__` at
once. The engine makes a view for each policy decision, one to three a step, and a whole
day's trace is a million steps of about four rows, where such fixed costs are most of the
engine's work (figures: docs/measurements/code-notes.md).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def make_frozen(cls: type[T], /, **fields: Any) -> T:
    """`cls(**fields)` for a frozen dataclass with `__dict__` and no `__post_init__`, every
    field given: the same instance (equal, the same `vars`), still frozen against a policy's
    assignment. `tests/test_invariants.py` checks it against `__init__` for each class the
    engine makes this way."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made
