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
# Import paths of modules that were moved into the job folders; nothing may answer to them.
REMOVED = (
    "framework.policy",
    "framework.hookspecs",
    "framework.sequence",
    "plugins.schedulers.admission",
)
MAX_LINES = 450  # a module's length bound under framework/: one job a file

# Which job may import which: each group only from those listed (and itself).
MAY_IMPORT = {
    "api": {"engine"},  # the contract names the engine's state a plugin reads
    "workloads": {"engine"},
    "engine": {"api"},
    "executors": {"engine"},
    "tracking": set(),  # MLflow, progress and plots read files and configs, not the engine
    "run": {"api", "engine", "executors", "workloads", "tracking"},
    "serve": {"api", "engine", "executors", "workloads", "tracking", "run"},  # a run, online
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
GRAPH = {m: framework_imports(p) for m, p in FILES.items()}


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
        if "observers" in path.parts:
            continue  # observers also read the run's tables
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("framework")
        }
        assert used <= {"framework.api"}, f"{path.relative_to(ROOT)} imports {used}"


@pytest.mark.parametrize("old", REMOVED)
def test_the_moved_modules_left_no_alias_behind(old: str) -> None:
    """One import path per module: the old paths are gone, file and import alike."""
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()
    sys.modules.pop(old, None)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize("module", sorted(FILES))
def test_every_framework_module_stays_short(module: str) -> None:
    lines = len(FILES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} is {lines} lines; split it by job (<= {MAX_LINES})"


def test_the_engine_never_branches_on_a_missing_cache() -> None:
    """The pool hides prefix caching behind one interface (`BlockPool`): the engine asks a
    pool that caches nothing the same questions, so no engine module tests for a cache, by
    `is None` or by the pool's type."""
    found = []
    for module, path in FILES.items():
        if job(module) != "engine" or module == "framework.engine.prefix_cache":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Is | ast.IsNot) for op in node.ops
            ):
                names = {ast.unparse(x) for x in (node.left, *node.comparators)}
                if any("cache" in n.lower() for n in names):
                    found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "isinstance"
                and "Caching" in ast.unparse(node)
            ):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Attribute) and node.attr == "caches_prefixes":
                found.append(f"{module}:{node.lineno}: reads caches_prefixes")
    assert not found, "the engine tests for a cache: " + "; ".join(found)


def test_views_only_read() -> None:
    """A policy's views assign nothing, to themselves or to what they show: what a lookup
    finds for a sequence is the engine's to record."""
    tree = ast.parse((ROOT / "framework/api/policy.py").read_text(encoding="utf-8"))
    views = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name in {"EngineView", "OutputView", "QueueView"}
    ]
    assert len(views) == 3
    writes = []
    for cls in views:
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            if fn.name == "__init__":
                continue  # QueueView keeps the queue it shows
            for node in ast.walk(fn):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute | ast.Subscript):
                        writes.append(f"{cls.name}.{fn.name}: {ast.unparse(t)}")
                if isinstance(node, ast.Call) and "setattr" in ast.unparse(node.func):
                    writes.append(f"{cls.name}.{fn.name}: {ast.unparse(node)}")
    assert not writes, f"views write: {writes}"


def test_one_release_path() -> None:
    """Blocks go back to the pool in one place, `Planner.release`: finishing, preemption,
    abort and a hand-off all call it, so freeing, emptying the table and setting the status
    cannot drift apart. No other code under framework/ or plugins/ calls a pool's `free` or
    empties a block table."""

    def frees(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr == "free" and "pool" in ast.unparse(node.func.value)
        return (
            isinstance(node, ast.Assign)
            and any(ast.unparse(t).endswith("block_table") for t in node.targets)
            and isinstance(node.value, ast.List)
            and not node.value.elts
        )

    planner = ast.parse((ROOT / "framework/engine/planner.py").read_text(encoding="utf-8"))
    (release,) = [
        n for n in ast.walk(planner) if isinstance(n, ast.FunctionDef) and n.name == "release"
    ]
    inside = {id(n) for n in ast.walk(release)}
    assert sum(frees(n) for n in ast.walk(release)) == 2, "release no longer frees and empties"
    stray = []
    for path in [*(ROOT / "framework").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        tree = planner if path == ROOT / "framework/engine/planner.py" else None
        for node in ast.walk(tree or ast.parse(path.read_text(encoding="utf-8"))):
            if frees(node) and id(node) not in inside:
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not stray, "blocks freed outside Planner.release: " + "; ".join(stray)
