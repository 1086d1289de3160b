"""The policies the tools measure against, and the overrides a timing tool runs under. Configs
are composed by `framework.run.compose.compose_cfg`, the same way for every tool."""

from __future__ import annotations

Combo = tuple[str, str, str]  # scheduler, allocator, output
# The policy the others are measured against (outputs, capacity).
REFERENCE: Combo = ("continuous", "incremental", "immediate")
# Under a timing tool's overrides: invariant checks are host work that a serving engine would
# not do on every step.
TIMED = ["engine.check_invariants=false"]


def combo_overrides(overrides: list[str], combo: Combo) -> list[str]:
    """`overrides` with one scheduler x allocator x output policy."""
    scheduler, allocator, output = combo
    return [*overrides, f"scheduler={scheduler}", f"allocator={allocator}", f"output={output}"]
