"""Loading a plugin written for policy API 1 under API 2.

API 2 renamed four of the view's names and kept every other part of the contract. A module
that declares `NANOSERVE_API = 1` and uses none of them works unchanged, so it is loaded; one
that uses them would fail mid-run with an AttributeError, so it is refused at load time with
the one line that says what to write instead.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

from framework.api.policy import RENAMED_IN_2


def _sources(module: ModuleType) -> list[Path]:
    """The module's file, or every file of a package."""
    file = getattr(module, "__file__", None)
    if not file:
        return []
    path = Path(file)
    if path.name == "__init__.py":
        return sorted(path.parent.rglob("*.py"))
    return [path]


def v1_problem(module: ModuleType) -> str | None:
    """Why a module written for API 1 cannot run under API 2 (its first use of a renamed
    name, and the replacement), or None when it can."""
    for path in _sources(module):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # it imported, so whatever this file is, it is not the module's code
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in RENAMED_IN_2:
                return (
                    f"it is written for policy API 1 and uses `{node.attr}` "
                    f"({path.name}:{node.lineno}); API 2 spells it "
                    f"{RENAMED_IN_2[node.attr]}: change that and declare NANOSERVE_API = 2"
                )
    return None
