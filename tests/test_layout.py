"""The tree shows the design: framework/ is grouped by job, dependencies point one way, and
no module imports another that (directly or not) imports it back.

Read from the source with `ast`, so nothing is imported and every import counts, those
under `if TYPE_CHECKING:` and inside functions included.
"""

from __future__ import annotations

import ast
import importlib
import re
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
# The jobs that need more, with their own bound and why: split, they would be two files
# sharing one job's state.
LONGER = {
    # every decision of a step checked and applied (evict, grow, preempt by recompute or
    # swap, displace, choose, admit, a beam search's round) by the one owner of the queues:
    # split, the queues would have two writers
    "framework.engine.planner": 525,
    # the engine's verbs: the step's three calls and what the outside asks of one engine
    # (submit, abort, take over a request, park and reserve for a cluster, finish)
    "framework.engine.loop": 470,
}

# Which job may import which: each group only from those listed (and itself).
MAY_IMPORT = {
    # the types the contract names (a request, a sequence, a step's numbers, a cached block),
    # below both the contract and the engine
    "core": set(),
    "api": {"core"},  # the contract: it names the core types, never the engine
    # the plugin host: loads the contract's plugins (registry, compat), names them when they
    # raise (guard, faults)
    "plugin_host": {"core", "api"},
    "workloads": {"core", "engine"},
    "engine": {"core", "api", "plugin_host"},
    # a cluster of engines behind a router: one engine knows nothing of it
    "cluster": {"core", "api", "plugin_host", "engine"},
    "executors": {"core", "engine"},
    "tracking": {"core"},  # MLflow, progress and plots read files and configs, not the engine
    "run": {
        "core",
        "api",
        "plugin_host",
        "engine",
        "cluster",
        "executors",
        "workloads",
        "tracking",
    },
    # a run, online
    "serve": {"core", "api", "plugin_host", "engine", "executors", "workloads", "tracking", "run"},
    # runs, sweeps and searches, compared; a reproduction builds its workloads once and reads
    # the simulated GPU's specs and model shapes its set-up is stated in
    "studies": {
        "core",
        "api",
        "plugin_host",
        "engine",
        "cluster",
        "executors",
        "workloads",
        "run",
        "tracking",
    },
    "calibration": {"core", "engine", "executors", "workloads", "run", "tracking"},
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
    bound = LONGER.get(module, MAX_LINES)
    assert lines <= bound, f"{module} is {lines} lines; split it by job (<= {bound})"


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


MUTATORS = {"append", "appendleft", "extend", "insert", "pop", "popleft", "remove", "clear"}
MUTATORS |= {"update", "setdefault", "add", "discard", "sort", "reverse"}
# What the engine's answers to a view may write, each a memo of a lookup, not a change to
# what runs: a prefix cache's lookups while it stands (`_looked`, `_looked_at`), the waiting
# requests a lookup was recorded on (`_recorded`), a request's kept block hashes
# (`block_hashes`), and the one record the policy contract names: a waiting request's cached
# prefix, which its `step_tokens` leaves out (`cached_prefix`).
MEMOS = {"_looked", "_looked_at", "_recorded", "block_hashes", "cached_prefix"}


def methods(path: str, cls: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    return {n.name: n for n in found.body if isinstance(n, ast.FunctionDef)}


def assigned(node: ast.AST) -> list[ast.expr]:
    """The targets `node` assigns to, if it is an assignment (plain, augmented or annotated)."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def writes_in(fn: ast.FunctionDef) -> list[str]:
    """Every assignment to an attribute or item, and every mutating call, in `fn`, named by
    the attribute it changes; a local made in the function (a fresh list) is its own."""
    alias: dict[str, str | None] = {}  # a local name -> the attribute it aliases (None: fresh)
    for node in ast.walk(fn):
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name):
            alias[target.id] = value.attr if isinstance(value, ast.Attribute) else None
    found = []

    def root(e: ast.expr) -> str | None:
        if isinstance(e, ast.Attribute):
            return e.attr
        if isinstance(e, ast.Subscript):
            return root(e.value)
        if isinstance(e, ast.Name):
            return alias.get(e.id, e.id if e.id not in alias else None)
        return "?"

    for node in ast.walk(fn):
        for t in assigned(node):
            if isinstance(t, ast.Attribute | ast.Subscript):
                found.append(root(t) or "?")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS:
                name = root(node.func.value)
                if name is not None:
                    found.append(name)
            if "setattr" in ast.unparse(node.func):
                found.append("setattr")
    return [w for w in found if w not in MEMOS]


def test_views_only_read_at_any_depth() -> None:
    """A policy's views change nothing, however deep their questions go: every method of
    the three views, and each engine method a view's question reaches (`Lookups`, which the
    planner gives every view as its rules and price, and the pool's lookups it calls), is
    followed call by call, and none assigns or mutates anything but the lookups' memos."""
    planner = methods("framework/engine/planner.py", "Planner")
    made = ast.unparse(planner["view"])
    assert "rules=self.lookups" in made and "blocks_to_admit=self.lookups.price" in made
    engine_side = {
        "Lookups": methods("framework/engine/lookups.py", "Lookups"),
        "BlockPool": methods("framework/engine/block_pool.py", "BlockPool"),
        "PrefixCachingPool": methods("framework/engine/prefix_cache.py", "PrefixCachingPool"),
    }
    todo: list[tuple[str, ast.FunctionDef]] = []
    for cls in ("EngineView", "OutputView", "QueueView"):
        for name, fn in methods("framework/api/policy.py", cls).items():
            if name != "__init__":  # QueueView keeps the queue it shows
                todo.append((cls, fn))
    todo.append(("Lookups", engine_side["Lookups"]["price"]))  # `view.blocks_to_admit`
    seen: set[tuple[str, str]] = set()
    writes = []
    while todo:
        cls, fn = todo.pop()
        if (cls, fn.name) in seen:
            continue
        seen.add((cls, fn.name))
        writes += [f"{cls}.{fn.name} writes {w}" for w in writes_in(fn)]
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner, name = ast.unparse(node.func.value), node.func.attr
            if owner == "self.rules":
                targets = ["Lookups"]
            elif owner == "self" and cls in engine_side:
                targets = [cls]
            elif owner == "self.pool":
                targets = ["BlockPool", "PrefixCachingPool"]
            else:
                continue  # a policy's own method, or a read of a sequence
            for target in targets:
                if name in engine_side[target]:
                    todo.append((target, engine_side[target][name]))
    assert ("Lookups", "cached_tokens") in seen and ("PrefixCachingPool", "hashes") in seen
    assert not writes, f"views write: {writes}"


def test_the_engine_composes_and_mixes_nothing_in() -> None:
    """`Engine` has no base class: ends from outside (`Aborts`) and a cluster's parked
    requests (`Parking`) are objects of their own, each with its own state, which the engine
    holds, rather than mixins that redeclare the engine's attributes."""
    tree = ast.parse((ROOT / "framework/engine/loop.py").read_text(encoding="utf-8"))
    (engine,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine"]
    assert not engine.bases
    for path in (ROOT / "framework/engine").glob("*.py"):
        assert "Mixed into" not in path.read_text(encoding="utf-8"), path.name


def test_one_owner_of_the_queues() -> None:
    """The planner alone holds and moves the queues (`pending`, `waiting`, `running`):
    nothing else under framework/ assigns one or changes what it holds."""
    queues = {"pending", "waiting", "running"}
    stray = []
    for path in (ROOT / "framework").rglob("*.py"):
        if path == ROOT / "framework/engine/planner.py" or "kernels" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and t.attr in queues:
                        stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr in queues
            ):
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not stray, "queues moved outside the planner: " + "; ".join(stray)


HELD_STATE = {"on_device", "handed", "finished", "kept", "log", "unread", "readback_s"}
HELD_STATE |= {"device_timed"}


def test_the_held_tokens_have_one_writer() -> None:
    """`HeldTokens` alone changes what it holds (the steps on the device, the rows handed
    off, the step's finished requests): an abort, a hand-off or a replica's loss asks it
    through a method, so the tokens reach requests by one code path."""
    stray = []
    for path in (ROOT / "framework").rglob("*.py"):
        if path == ROOT / "framework/engine/held.py" or "kernels" in path.parts:
            continue

        def held_state(e: ast.expr) -> bool:
            return (
                isinstance(e, ast.Attribute)
                and e.attr in HELD_STATE
                and ast.unparse(e.value).endswith("held")
            )

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for t in assigned(node):
                while isinstance(t, ast.Subscript):
                    t = t.value
                if held_state(t):
                    stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
                and held_state(node.func.value)
            ):
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not stray, "held tokens changed outside HeldTokens: " + "; ".join(stray)


def test_tokens_reach_requests_only_in_the_steps_two_verbs() -> None:
    """Held tokens come home and reach their requests (`HeldTokens.drain_all`, `drain`,
    `apply`, and the hand-offs they reveal, `take_handed`) only in the step's two verbs,
    `Engine.update_from_output` and `Engine.bring_home`: the planner yields when the rows are
    about to change, and no policy, abort or planning step finishes a request itself."""
    verbs = {"drain_all", "drain", "apply", "take_handed", "hand_off"}
    allowed = {
        ("framework/engine/loop.py", "update_from_output"),
        ("framework/engine/loop.py", "bring_home"),
        ("framework/engine/held.py", "drain_all"),  # HeldTokens itself: drain, then apply
        ("framework/engine/planner.py", "hand_off"),  # the queue move bring_home asks for
    }
    stray = []
    for path in [*(ROOT / "framework").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in verbs
                    and (rel, fn.name) not in allowed
                    and ast.unparse(node.func.value).split(".")[-1]
                    in {"held", "tokens", "planner", "self"}
                    and rel.startswith(("framework/engine", "framework/cluster", "plugins"))
                ):
                    stray.append(f"{rel}:{node.lineno} in {fn.name}: {ast.unparse(node)}")
    assert not stray, "held tokens reach requests outside the step's verbs: " + "; ".join(stray)


def test_no_policy_is_changed_from_outside_its_class() -> None:
    """The engine configures a policy only through what it hands it (a view, a setting at
    construction, `Allocator.set_context`): no code under framework/ assigns an attribute of
    a policy object (`<...>.scheduler.x = ...`, `setattr` on the policies), and the planner
    and lookups hold the guarded policies by their type, not `Any`."""
    groups = {"scheduler", "allocator", "preemption", "output"}
    stray = []
    for path in (ROOT / "framework").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for t in assigned(node):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Attribute)
                    and t.value.attr in groups
                ):
                    stray.append(f"{rel}:{node.lineno}: {ast.unparse(t)}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and rel != "framework/engine/settings.py"  # GuardedPolicies.use, its own
                and any(g in ast.unparse(node) for g in ("policies", ".p,", "policy"))
            ):
                stray.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not stray, "a policy's attribute set from outside: " + "; ".join(stray)
    for rel in ("framework/engine/planner.py", "framework/engine/lookups.py"):
        init = next(
            n
            for n in ast.walk(ast.parse((ROOT / rel).read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef) and n.name == "__init__"
        )
        hints = {a.arg: ast.unparse(a.annotation) for a in init.args.args if a.annotation}
        assert hints["policies"] == "GuardedPolicies", rel
        assert "Any" not in hints.values(), f"{rel}: {hints}"


def test_one_release_path() -> None:
    """Blocks go back to the pool in one place, `Planner.release`: finishing, preemption,
    abort and a hand-off's sent KV all call it, so freeing, emptying the table and setting
    the status cannot drift apart. No other code under framework/ or plugins/ calls a pool's
    `free` or empties a block table. The host KV tier's pool has its own one release path,
    `HostTier._release` (a swap in, a drop, a swap undone), and nothing else frees there."""

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
    tier = ast.parse((ROOT / "framework/engine/host_tier.py").read_text(encoding="utf-8"))
    (own,) = [n for n in ast.walk(tier) if isinstance(n, ast.FunctionDef) and n.name == "_release"]
    assert sum(frees(n) for n in ast.walk(own)) == 1, "the host tier's release no longer frees"
    inside |= {id(n) for n in ast.walk(own)}
    trees = {
        ROOT / "framework/engine/planner.py": planner,
        ROOT / "framework/engine/host_tier.py": tier,
    }
    stray = []
    for path in [*(ROOT / "framework").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        tree = trees.get(path)
        for node in ast.walk(tree or ast.parse(path.read_text(encoding="utf-8"))):
            if frees(node) and id(node) not in inside:
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not stray, "blocks freed outside Planner.release: " + "; ".join(stray)


def test_the_product_never_reaches_into_experiments() -> None:
    """`experiments/` holds the tools people run by hand, on top of the framework; nothing
    under framework/ or plugins/ imports it, and no config under conf/ names it as a target
    (a `_target_` or any other value), so a product config never depends on the lab."""
    import yaml

    found = []
    for path in [*(ROOT / "framework").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: imports {n}"
                for n in names
                if n.split(".")[0] == "experiments"
            ]

    def strings(node: object) -> list[str]:
        if isinstance(node, dict):
            return [s for k, v in node.items() for s in (*strings(k), *strings(v))]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    configs = sorted((ROOT / "conf").rglob("*.yaml"))
    assert any(p.parent.name == "experiment" for p in configs)
    for path in configs:
        for text in strings(yaml.safe_load(path.read_text(encoding="utf-8"))):
            if text.strip().startswith("experiments.") or "experiments/" in text:
                found.append(f"{path.relative_to(ROOT)}: names {text}")
    assert not found, "the product depends on experiments/: " + "; ".join(found)


def test_no_private_field_is_read_outside_its_class() -> None:
    """A field named `_x` is its class's own: no code under framework/ or plugins/ reads one
    through another object (`seq._max_tokens`), which would tie it to a detail the class may
    change. Third-party internals with no public form are listed with their reason."""

    def third_party(expr: str) -> bool:
        return (
            expr.startswith("torch.ops.")  # PyTorch's oneDNN operators, registered with _
            or expr.endswith("config._attn_implementation")  # transformers: the attention
        )

    found = []
    for path in [*(ROOT / "framework").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or third_party(ast.unparse(node)):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "private fields read from outside: " + "; ".join(found)


def layout_block() -> list[str]:
    """The lines of docs/architecture.md's layout block (the fenced block under
    '## Layout by job')."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Layout by job", 1)[1]
    return section.split("```", 2)[1].splitlines()


def test_the_architecture_layout_names_every_module_and_no_other() -> None:
    """Each module directly in a framework/ job folder is named in its folder's part of the
    layout (`name.py`, or a `prefix*.py` for a family), each name there is a file of that
    folder, and each subfolder it names exists: the page describes the tree as it is."""
    parts: dict[str, list[str]] = {}
    job = None
    for line in layout_block():
        head = line[:23].strip()
        if line.startswith("  ") and not line.startswith("    ") and head.endswith("/"):
            job = head.rstrip("/") if (ROOT / "framework" / head).is_dir() else None
            parts[job or ""] = [line]
            continue
        if not line.startswith("    ") and line.strip() and not line.startswith("  "):
            job = None  # a top-level entry (plugins/, conf/, ...)
        if job is not None:
            parts[job].append(line)
    parts.pop("", None)
    problems = []
    for name in sorted(p.name for p in (ROOT / "framework").iterdir() if p.is_dir()):
        if name == "__pycache__":
            continue
        text = "\n".join(parts.get(name, []))
        folder = ROOT / "framework" / name
        named = set(re.findall(r"\b([a-z_0-9]+\*?)\.py\b", text))
        families = [n[:-1] for n in named if n.endswith("*")]
        for f in sorted(folder.glob("*.py")):
            stem = f.stem
            if (
                stem != "__init__"
                and stem not in named
                and not any(stem.startswith(fam) for fam in families)
            ):
                problems.append(f"framework/{name}/{f.name} is not in the layout")
        for n in sorted(named):
            if n.endswith("*") or (ROOT / f"{n}.py").exists():  # a family; run.py, serve.py
                continue
            where = [folder, *(folder / d for d in subfolders(folder))]
            if not any((f / f"{n}.py").exists() for f in where):
                problems.append(f"the layout names {name}/{n}.py, which does not exist")
        for sub in re.findall(r"^\s{4}([a-z_]+)/", text, flags=re.M):
            if not (folder / sub).is_dir():
                problems.append(f"the layout names {name}/{sub}/, which does not exist")
    assert not problems, "; ".join(problems)


def subfolders(folder: Path) -> list[str]:
    return [d.name for d in folder.iterdir() if d.is_dir() and d.name != "__pycache__"]


def test_the_contract_types_live_in_core_and_the_api_names_them() -> None:
    """A plugin written against the README imports the contract's types from
    `framework.api`; they are the core's own objects, and the contract imports no engine
    module (MAY_IMPORT: api may depend on core alone)."""
    import framework.api as api
    from framework.core import cached_block, request, sequence, step_stats

    assert api.Sequence is sequence.Sequence and api.Status is sequence.Status
    assert api.RequestSpec is request.RequestSpec
    assert api.SamplingParams is request.SamplingParams
    assert api.StepStats is step_stats.StepStats and api.PHASES is step_stats.PHASES
    assert api.CachedBlock is cached_block.CachedBlock
    assert MAY_IMPORT["api"] == {"core"} and MAY_IMPORT["core"] == set()


def test_routers_receive_views_never_an_engine() -> None:
    """A router's `ClusterView` holds plain-data snapshots (`ReplicaState`), taken by the
    cluster through a `ReplicaView` (whose replica stays private) or by a Ray replica: what a
    router may read is the contract's `Replica`, never an engine's state."""
    from framework.api.router import ReplicaView

    assert ReplicaView.__slots__ == ("_engine", "index")
    for path in (ROOT / "framework" / "cluster").glob("*.py"):  # every view a snapshot
        assert "ClusterView(" not in path.read_text(encoding="utf-8"), path.name
    tree = ast.parse((ROOT / "framework/api/router.py").read_text(encoding="utf-8"))
    named = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.startswith("framework.engine") for m in named), named
    for path in (ROOT / "plugins" / "routers").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "framework.engine" not in text and "._engine" not in text, path.name
