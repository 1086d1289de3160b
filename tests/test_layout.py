"""The tree shows the design: framework/ is grouped by job, dependencies point one way, and
no module imports another that (directly or not) imports it back.

Read from the source with `ast`, so nothing is imported and every import counts, those
under `if TYPE_CHECKING:` and inside functions included.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPRECATED = {"framework.policy", "framework.hookspecs", "framework.sequence"}

# Which job may import which: each group only from those listed (and itself).
MAY_IMPORT = {
    "api": {"engine"},  # the contract names the engine's state a plugin reads
    "workloads": {"engine"},
    "engine": {"api"},
    "executors": {"engine"},
    "tracking": set(),  # MLflow, progress and plots read files and configs, not the engine
    "run": {"api", "engine", "executors", "workloads", "tracking"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def framework_imports(path: Path) -> set[str]:
    """Every `framework.*` module that `path` imports (a `from pkg import name` counts as
    `pkg.name` when that is a module, else as `pkg`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("framework")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("framework"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m in MODULES}


FILES = {module_name(p): p for p in (ROOT / "framework").rglob("*.py") if "kernels" not in p.parts}
MODULES = set(FILES)
GRAPH = {m: framework_imports(p) for m, p in FILES.items() if m not in DEPRECATED}


def job(module: str) -> str | None:
    """`engine` for `framework.engine.loop` and for `framework.engine` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_framework_module_lives_in_a_job_folder() -> None:
    loose = sorted(m for m in GRAPH if m != "framework" and job(m) not in MAY_IMPORT)
    assert "framework.engine.loop" in GRAPH and "framework.api" in GRAPH
    assert not loose, f"modules outside the job folders of framework/: {loose}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_one_way(module: str) -> None:
    if module == "framework":
        return
    mine = job(module)
    wrong = sorted(
        dep
        for dep in GRAPH[module]
        if job(dep) not in {mine, *MAY_IMPORT[mine]}  # type: ignore[index]
    )
    assert not wrong, f"{module} ({mine}) imports {wrong}, which {mine} may not depend on"


def test_no_circle_of_imports() -> None:
    """Depth-first search for a back edge; the circle found is printed whole."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for dep in sorted(GRAPH.get(m, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (circle := visit(dep)):
                return circle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (circle := visit(m)):
            pytest.fail("import circle: " + " -> ".join(circle))


def test_the_engine_never_imports_an_executor_or_the_model_libraries() -> None:
    for module, path in FILES.items():
        if job(module) != "engine":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        heavy = sorted(n for n in names if n.split(".")[0] in {"transformers", "accelerate"})
        assert not heavy, f"{module} imports {heavy}: the engine must not need a model library"


def test_plugins_import_the_contract_from_one_place() -> None:
    """Built-in policies are written as a third party would write them: `framework.api`."""
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        if path.name == "admission.py" or "observers" in path.parts:
            continue  # the deprecated alias; observers also read the run's tables
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("framework")
        }
        assert used <= {"framework.api"}, f"{path.relative_to(ROOT)} imports {used}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("framework.policy", "framework.api.policy"),
        ("framework.hookspecs", "framework.api.hookspecs"),
        ("framework.sequence", "framework.engine.sequence"),
        ("plugins.schedulers.admission", "framework.api.admission"),
    ],
)
def test_the_deprecated_paths_are_the_new_modules(old: str, new: str) -> None:
    """A plugin written before the move still imports and gets the very same classes."""
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=old):
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
