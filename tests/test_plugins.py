"""Third-party plugins: entry points, configs in the ConfigStore, the policy contract, errors
a user can act on, and an outside package installed and run the way a user would.

Most tests run in-process. The CLI tests start `run.py` in a subprocess (about 10 s each,
for imports), so there are few of them and each checks several things.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pluggy
import pytest
import torch
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException

import framework.plugin_host.registry
from framework.api import hookspecs
from framework.api.admission import admit_fcfs, admit_in_order, room_for
from framework.api.hookspecs import hookimpl
from framework.api.policy import (
    EngineView,
    PolicyConfig,
    PolicyError,
    Preemption,
    Scheduler,
)
from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import Sequence, Status
from framework.plugin_host.registry import PluginError, Registry, UnknownPolicyError, registry
from framework.run.preflight import unknown_policies
from framework.run.summary import summarize
from plugins.preemption.priority import PriorityPreemption, PriorityPreemptionConfig
from plugins.schedulers.priority import PriorityScheduler, displace
from plugins.schedulers.sjf import SJFConfig, SJFScheduler
from tests.helpers import ROOT, assert_refused, make_cfg, run_engine
from tests.test_cli import choice_groups

EXAMPLE = ROOT / "tests" / "fixtures" / "nanoserve-example-plugin"
EXAMPLE_DIST = "nanoserve-example-plugin"
BROKEN_DIST = "nanoserve-broken-plugin"

# Four requests that one row serves in turn: FCFS finishes r0..r3, SJF by output length
# finishes r3 (1 token), r1 (3), r2 (8), r0 (12).
SJF_WORKLOAD = [
    "model=tiny",
    "workload=fixed",
    "workload.prompt_lens=[8,8,8,8]",
    "workload.output_lens=[12,3,8,1]",
    "engine.max_num_seqs=1",
    "print_outputs=false",
]
FCFS_ORDER = ["r0", "r1", "r2", "r3"]
SJF_ORDER = ["r3", "r1", "r2", "r0"]


# --- helpers --------------------------------------------------------------------------------


def make_seq(
    rid: str,
    prompt_len: int = 4,
    max_tokens: int = 8,
    priority: int = 0,
    arrival: float = 0.0,
    status: Status = Status.WAITING,
) -> Sequence:
    spec = RequestSpec(
        rid,
        list(range(1, prompt_len + 1)),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        arrival=arrival,
        priority=priority,
    )
    s = Sequence(spec, eos_token_id=None)
    s.status = status
    return s


def make_running(rid: str, admit_order: int, blocks: int = 1, **fields: Any) -> Sequence:
    """A decode row: its prompt is in the cache, one token goes into the next forward."""
    s = make_seq(rid, status=Status.RUNNING, **fields)
    s.admit_order = admit_order
    s.num_computed = s.num_tokens - 1
    s.block_table = list(range(10 * admit_order, 10 * admit_order + blocks))
    return s


def make_view(
    waiting: tuple[Sequence, ...] = (),
    running: tuple[Sequence, ...] = (),
    free_blocks: int = 100,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 1000,
    now: float = 0.0,
    price: Callable[[Sequence], int] = lambda s: 1,
) -> EngineView:
    """A hand-built view; `price` is the allocator's price in blocks (one by default)."""
    return EngineView(
        now=now,
        step=0,
        waiting=waiting,
        running=running,
        free_blocks=free_blocks,
        block_size=16,
        num_blocks=100,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        blocks_to_admit=price,
    )


def ids(seqs: list[Sequence]) -> list[str]:
    return [s.id for s in seqs]


def plugin_module(name: str, **hooks: Callable[..., Any]) -> types.ModuleType:
    """A plugin module built in memory; each keyword is a hook implementation."""
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, hookimpl(fn))
    return module


def empty_registry() -> Registry:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return Registry(pm)


def fake_dist(root: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """Lay out an installed distribution as pip would: modules plus a .dist-info folder."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[nanoserve]\n{lines}")
    return root


def broken_dist(root: Path) -> Path:
    """One plugin that fails to import, and one written for another policy API version."""
    return fake_dist(
        root,
        BROKEN_DIST,
        {
            "nanoserve_broken_plugin": "import nanoserve_missing_dependency  # not installed\n",
            "nanoserve_future_plugin": "NANOSERVE_API = 99\n",
        },
        {"broken": "nanoserve_broken_plugin", "future": "nanoserve_future_plugin"},
    )


class NullScheduler(Scheduler):
    def evict(self, view: EngineView) -> list[Sequence]:
        return []

    def admit(self, view: EngineView) -> list[Sequence]:
        return []


def finish_order(seqs: list[Sequence]) -> list[str]:
    return [s.id for s in sorted(seqs, key=lambda s: s.finished_at or 0.0)]


def csv_finish_order(run_dir: Path) -> list[str]:
    with (run_dir / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert all(r["status"] == "released" for r in rows), rows
    return [r["id"] for r in sorted(rows, key=lambda r: float(r["finished_s"]))]


# --- built-ins take the plugin path ---------------------------------------------------------


def test_builtins_register_through_entry_points_with_their_distribution() -> None:
    reg = registry()
    assert reg.load_errors == []
    expected = {
        "scheduler": {"continuous", "static", "priority", "sjf", "chunked", "lpm", "prefill_first"},
        "allocator": {"incremental", "worst_case", "prefix_cache"},
        "preemption": {"recompute", "priority"},
        "output": {"immediate"},
    }
    for group, names in expected.items():
        for name in names:
            assert reg.policies[group][name].provider.distribution == "nanoserve", name
            # register_configs (tests.helpers) stored each config where Hydra looks.
            assert f"{name}.yaml" in ConfigStore.instance().repo[group], name
    assert "sjf (nanoserve)" in reg.choices("scheduler")


def test_policy_options_are_checked_by_their_dataclass() -> None:
    @dataclass
    class CountConfig(PolicyConfig):
        n: int = 1

    reg = empty_registry()
    module = plugin_module(
        "counting", register_schedulers=lambda register: register("c", NullScheduler, CountConfig)
    )
    reg.add_plugin(module, "counting", "dist-c")
    built = reg.build("scheduler", {"name": "c", "n": 3})
    assert built.cfg == CountConfig(name="c", n=3)
    with pytest.raises(ValueError, match=r"scheduler\.bogus is not an option of scheduler 'c' "):
        reg.build("scheduler", {"name": "c", "bogus": 1})
    with pytest.raises(ValueError, match=r"scheduler\.n: Value 'many' .* Integer"):
        reg.build("scheduler", {"name": "c", "n": "many"})


# --- errors a user can act on ---------------------------------------------------------------


def test_two_plugins_registering_one_name_is_an_error_naming_both() -> None:
    reg = empty_registry()
    first = plugin_module("a", register_schedulers=lambda register: register("x", NullScheduler))
    second = plugin_module("b", register_schedulers=lambda register: register("x", NullScheduler))
    reg.add_plugin(first, "a", "dist-a")
    with pytest.raises(PluginError) as info:
        reg.add_plugin(second, "b", "dist-b")
    message = str(info.value)
    assert "scheduler 'x' is registered twice" in message
    assert "plugin 'a' (distribution dist-a)" in message
    assert "plugin 'b' (distribution dist-b)" in message


def test_a_bad_registration_names_the_plugin() -> None:
    reg = empty_registry()
    wrong_base = plugin_module("c", register_schedulers=lambda register: register("y", dict))
    with pytest.raises(
        PluginError, match=r"plugin 'c' \(distribution dist-c\): scheduler 'y' must subclass"
    ):
        reg.add_plugin(wrong_base, "c", "dist-c")

    def explode(register: Any) -> None:
        raise RuntimeError("boom")

    raising = plugin_module("d", register_preemptions=explode)
    with pytest.raises(PluginError, match=r"plugin 'd' .*register_preemptions failed.*boom"):
        reg.add_plugin(raising, "d", "dist-d")


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(broken_dist(tmp_path / "site")))
    reg = Registry.from_entry_points()
    errors = {e.plugin: e for e in reg.load_errors}
    assert set(errors) == {"broken", "future"}
    assert errors["broken"].distribution == BROKEN_DIST
    assert "ModuleNotFoundError" in errors["broken"].error
    assert "nanoserve_missing_dependency" in str(errors["broken"])
    assert "written for policy API 99" in str(errors["future"])
    assert {"continuous", "priority", "sjf", "static"} <= set(reg.policies["scheduler"])
    # A missing name then points at the plugin that failed.
    with pytest.raises(UnknownPolicyError, match=r"(?s)Plugins that failed to load:.*broken"):
        reg.get("scheduler", "fifo")


V1_CHUNKER = """
from framework.api import EngineView, PolicyConfig, Scheduler, admit_fcfs, hookimpl

NANOSERVE_API = 1


class OldChunker(Scheduler):
    chunks_prefill = True  # API 1's flag: no longer read, and harmless

    def evict(self, view):
        return [s for s in view.running if s.finished]

    def admit(self, view):
        return admit_fcfs(view)

    def chunk(self, view, seq, budget):
        return min(seq.step_tokens, budget, 4)


@hookimpl
def register_schedulers(register):
    register("old_chunker", OldChunker, PolicyConfig)
"""

V1_RENAMED = """
from framework.api import hookimpl

NANOSERVE_API = 1


def fits(view, seq):
    return view.tokens_for(seq, view.max_num_batched_tokens) <= view.max_num_batched_tokens


@hookimpl
def register_schedulers(register):
    pass
"""


def test_a_plugin_for_api_1_loads_unless_it_uses_a_renamed_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """API 2 renamed four view names. A plugin written for API 1 that uses none of them (as
    the README's and the example package's do) loads as it is; one that does is refused with
    the line to change, naming the file and line."""
    site = fake_dist(
        tmp_path / "site",
        "nanoserve-v1-plugins",
        {"nanoserve_v1_chunker": V1_CHUNKER, "nanoserve_v1_renamed": V1_RENAMED},
        {"old_chunker": "nanoserve_v1_chunker", "renamed": "nanoserve_v1_renamed"},
    )
    monkeypatch.syspath_prepend(str(site))
    reg = Registry.from_entry_points()
    errors = {e.plugin: str(e) for e in reg.load_errors}
    assert set(errors) == {"renamed"}
    assert (
        "written for policy API 1 and uses `tokens_for` (nanoserve_v1_renamed.py:8)"
        in (errors["renamed"])
    )
    assert "view.chunk(seq, budget)" in errors["renamed"]
    assert "NANOSERVE_API = 2" in errors["renamed"]
    assert "old_chunker" in reg.policies["scheduler"]


def test_overriding_chunk_alone_serves_a_long_prompt_in_chunks(tiny: Any) -> None:
    """No flag to keep in step: a scheduler with a `chunk` of its own is served prompts
    longer than the step's token budget, in chunks; the same scheduler without one has the
    request rejected up front."""
    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine
    from plugins.schedulers.continuous import ContinuousScheduler

    class FourAtATime(ContinuousScheduler):
        def chunk(self, view: EngineView, seq: Sequence, budget: int) -> int:
            return min(seq.step_tokens, budget, 4)

    model, tok = tiny
    spec = RequestSpec("long", list(range(5, 25)), SamplingParams(max_tokens=3, ignore_eos=True))
    served = {}
    for cls in (ContinuousScheduler, FourAtATime):
        cfg = make_cfg("model=tiny", "engine.max_num_batched_tokens=8", "engine.max_num_seqs=2")
        engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
        engine.p.use("scheduler", cls(PolicyConfig()), "x")
        result = engine.run([spec], tok.eos_token_id)
        served[cls.__name__] = result.seqs[0]
    assert served["ContinuousScheduler"].status is Status.REJECTED
    long = served["FourAtATime"]
    assert long.finish_reason == "length" and len(long.output_token_ids) == 3
    # 20 prompt tokens in chunks of at most 4: five prefill chunks, then two decodes.
    assert result.counters.prefill_chunks == 5
    assert result.counters.prefill_tokens == 20


@pytest.mark.parametrize(
    ("argv", "unknown"),
    [
        (["scheduler=fifo"], [("scheduler", "fifo")]),
        (["-m", "scheduler=static,fifo", "hydra.sweep.dir=x"], [("scheduler", "fifo")]),
        (["--multirun", "allocator=choice(incremental,paged)"], [("allocator", "paged")]),
        (["+preemption=swap", "output=immediate"], [("preemption", "swap")]),
        (["scheduler@alt=fifo"], [("scheduler", "fifo")]),
        (["--cfg", "job", "output=lazy"], [("output", "lazy")]),
        (["scheduler=sjf", "preemption=priority", "preemption.victim=x"], []),
        (["-m", "scheduler=glob(*)"], []),  # Hydra expands globs over registered names
        (["~scheduler", "workload=chat", "seed=3"], []),
    ],
)
def test_unknown_policy_names_are_found_in_runs_and_sweeps(
    argv: list[str], unknown: list[tuple[str, str]]
) -> None:
    assert unknown_policies(argv, registry()) == unknown


def test_unknown_policy_message_lists_every_group_with_providers() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        registry().get("scheduler", "fifo")
    lines = str(info.value).splitlines()
    assert lines[0] == "unknown policy: scheduler=fifo"
    by_group = {line.split(":")[0].strip(): line for line in lines[2:]}
    assert "continuous (nanoserve)" in by_group["scheduler"]
    assert "sjf (nanoserve)" in by_group["scheduler"]
    assert "worst_case (nanoserve)" in by_group["allocator"]
    assert "recompute (nanoserve)" in by_group["preemption"]
    assert "immediate (nanoserve)" in by_group["output"]


# --- the built-in orderings, on hand-built views ---------------------------------------------


def test_admission_follows_the_policy_order_within_budgets() -> None:
    a = make_seq("a", max_tokens=9, priority=2)
    b = make_seq("b", max_tokens=3, priority=1)
    c = make_seq("c", max_tokens=3, priority=0)
    d = make_seq("d", max_tokens=1, priority=1)
    queue = (a, b, c, d)
    assert ids(admit_fcfs(make_view(queue))) == ["a", "b", "c", "d"]
    assert ids(SJFScheduler(SJFConfig()).admit(make_view(queue))) == ["d", "b", "c", "a"]
    prio = PriorityScheduler(PolicyConfig())
    assert ids(prio.admit(make_view(queue))) == ["c", "b", "d", "a"]  # b before d: queue order
    # Budgets: two free blocks, two rows left, and the head blocks what it cannot follow.
    assert ids(prio.admit(make_view(queue, free_blocks=2))) == ["c", "b"]
    assert ids(admit_in_order(make_view(queue), lambda s: -s.priority, limit=1)) == ["a"]
    busy = tuple(make_running(f"r{i}", i) for i in range(7))
    assert ids(prio.admit(make_view(queue, busy))) == ["c"]
    # Tokens: c's four prompt tokens do not fit; nothing less urgent goes in its place.
    assert prio.admit(make_view(queue, busy, max_num_batched_tokens=10)) == []


def test_priority_preemption_takes_the_least_urgent_then_the_newest() -> None:
    policy = PriorityPreemption(PriorityPreemptionConfig())
    urgent = make_running("urgent", 0, priority=0)
    old_low = make_running("old_low", 1, priority=5)
    new_low = make_running("new_low", 2, priority=5)
    done = make_running("done", 3, priority=9)
    done.status, done.finish_reason = Status.FINISHED, "stop"
    assert ids(policy.victims(make_view(running=(urgent, old_low, new_low, done)), 1)) == [
        "new_low"
    ]
    # The engine needs a victim while the pool is short: the last unfinished row is it.
    assert ids(policy.victims(make_view(running=(urgent, done)), 1)) == ["urgent"]


def test_displace_preempts_only_less_urgent_rows_and_only_if_that_makes_room() -> None:
    rows = (
        make_running("p1_old", 0, blocks=2, priority=1),
        make_running("p3", 1, blocks=1, priority=3),
        make_running("p1_new", 2, blocks=2, priority=1),
    )
    urgent = make_seq("urgent", priority=0)
    assert displace(make_view((urgent,), rows, free_blocks=1)) == []  # it fits already
    full = make_view((urgent,), rows, free_blocks=0, max_num_seqs=3)
    assert ids(displace(full)) == ["p3"]  # one row and one block: the least urgent suffices
    big = make_seq("big", prompt_len=40, priority=0)
    priced = make_view((big,), rows, free_blocks=0, price=lambda s: s.prompt_len)
    assert displace(priced) == []  # 40 blocks: preempting all three would not make room
    same = make_seq("same", priority=1)
    assert ids(displace(make_view((same,), rows, free_blocks=0, max_num_seqs=3))) == ["p3"]
    peer = make_view((make_seq("peer", priority=3),), rows, free_blocks=0, max_num_seqs=3)
    assert displace(peer) == []  # never an equally urgent row


# --- the built-in policies in the engine ----------------------------------------------------


def tiny_specs(
    priorities: list[int], max_tokens: list[int], prompt_len: int = 16
) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"r{i}",
            list(range(100 + i, 100 + i + prompt_len)),
            SamplingParams(max_tokens=n, ignore_eos=True),
            priority=p,
        )
        for i, (p, n) in enumerate(zip(priorities, max_tokens, strict=True))
    ]


def test_priority_and_sjf_schedulers_finish_in_their_order(tiny: Any) -> None:
    model, tok = tiny
    specs = tiny_specs([3, 0, 2, 1], [9, 3, 1, 5])
    one_row = "engine.max_num_seqs=1"
    by_priority = run_engine(
        make_cfg("model=tiny", "scheduler=priority", one_row), model, tok, specs
    )
    assert finish_order(by_priority.seqs) == ["r1", "r3", "r2", "r0"]
    by_length = run_engine(make_cfg("model=tiny", "scheduler=sjf", one_row), model, tok, specs)
    assert finish_order(by_length.seqs) == ["r2", "r1", "r3", "r0"]


def test_priority_preemption_spares_the_urgent_requests(tiny: Any) -> None:
    model, tok = tiny
    # Four 16-token prompts take one block each of six; growing past 16 tokens needs four
    # more: two rows must go.
    specs = tiny_specs([3, 0, 2, 1], [20, 20, 20, 20])
    pool = ["engine.num_blocks=6", "engine.block_size=16"]
    res = run_engine(
        make_cfg("model=tiny", "scheduler=priority", "preemption=priority", *pool),
        model,
        tok,
        specs,
    )
    preempted = {s.id for s in res.seqs if s.preemptions}
    assert preempted == {"r0", "r2"} and summarize(res)["preemptions"] == 2
    assert finish_order(res.seqs)[:2] == ["r1", "r3"]
    fifo = run_engine(make_cfg("model=tiny", *pool), model, tok, specs)
    assert {s.id for s in fifo.seqs if s.preemptions} == {"r2", "r3"}  # newest, blind to priority


# --- the contract is enforced, naming the plugin ---------------------------------------------


class AdmitsARunningRow(Scheduler):
    def evict(self, view: EngineView) -> list[Sequence]:
        return [s for s in view.running if s.finished]

    def admit(self, view: EngineView) -> list[Sequence]:
        return [*view.running[:1], *view.waiting[:1]]


class EvictsEveryRunningRow(Scheduler):
    """Names every running row, finished or not (asked once one has finished)."""

    def evict(self, view: EngineView) -> list[Sequence]:
        return list(view.running)

    def admit(self, view: EngineView) -> list[Sequence]:
        return admit_fcfs(view)


class CountsEvictions(EvictsEveryRunningRow):
    """Continuous batching that notes, each time it is asked to evict, how many running
    rows had finished."""

    asked: ClassVar[list[int]] = []

    def evict(self, view: EngineView) -> list[Sequence]:
        self.asked.append(sum(s.finished for s in view.running))
        return [s for s in view.running if s.finished]


class NamesAWaitingRequest(Preemption):
    """Asks the engine to free the blocks of a request that holds none."""

    def victims(self, view: EngineView, blocks_short: int) -> list[Sequence]:
        return list(view.waiting[:1])


@pytest.fixture
def rogue_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process registry plus a rogue third-party plugin, as if it were installed."""
    reg = Registry.from_entry_points()
    module = plugin_module(
        "rogue",
        register_schedulers=lambda register: (
            register("admits_running", AdmitsARunningRow),
            register("evicts_running", EvictsEveryRunningRow),
            register("counts_evictions", CountsEvictions),
        ),
        register_preemptions=lambda register: register("names_waiting", NamesAWaitingRequest),
    )
    reg.add_plugin(module, "rogue", "nanoserve-rogue-plugin")
    reg.store_configs(ConfigStore.instance())
    monkeypatch.setattr(framework.plugin_host.registry, "_REGISTRY", reg)
    yield


@pytest.mark.usefixtures("rogue_plugin")
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["scheduler=admits_running"],
            r"scheduler policy 'admits_running' \(nanoserve-rogue-plugin\): "
            r"admitted r0, which is not waiting",
        ),
        (
            ["preemption=names_waiting", "engine.num_blocks=6", "engine.block_size=16"],
            r"preemption policy 'names_waiting' \(nanoserve-rogue-plugin\): "
            r"named r6, not an unfinished running row",
        ),
    ],
)
def test_a_policy_that_breaks_the_contract_is_stopped_by_name(
    tiny: Any, overrides: list[str], message: str
) -> None:
    model, tok = tiny
    # Six of seven 16-token prompts fill the pool of six blocks; r6 waits.
    specs = tiny_specs([0] * 7, [20] * 7)
    with pytest.raises(PolicyError, match=message):
        run_engine(make_cfg("model=tiny", *overrides), model, tok, specs)


@pytest.mark.usefixtures("rogue_plugin")
def test_evict_is_asked_when_a_row_has_finished_and_its_contract_holds(tiny: Any) -> None:
    """The engine asks `evict` only before a forward in which some running row has
    finished (with none, it may name nothing): every call sees one, a run's results are
    continuous batching's, and a scheduler naming an unfinished row is still stopped."""
    model, tok = tiny
    specs = tiny_specs([0] * 4, [3, 9, 5, 12])
    CountsEvictions.asked = []
    counted = run_engine(make_cfg("model=tiny", "scheduler=counts_evictions"), model, tok, specs)
    plain = run_engine(make_cfg("model=tiny", "scheduler=continuous"), model, tok, specs)
    assert CountsEvictions.asked and all(n > 0 for n in CountsEvictions.asked)
    assert len(CountsEvictions.asked) < len(counted.steps)  # not asked every step
    assert [s.output_token_ids for s in counted.seqs] == [s.output_token_ids for s in plain.seqs]
    assert [s.values()[2:17] for s in counted.steps] == [s.values()[2:17] for s in plain.steps]
    with pytest.raises(PolicyError, match=r"evicted r1, not a finished running row"):
        run_engine(make_cfg("model=tiny", "scheduler=evicts_running"), model, tok, specs)


# --- the example package, installed as a user would -----------------------------------------


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install` of the example package into a folder of its own (no network needed).

    It is copied first: building in place would leave build/ and *.egg-info in the repo.
    """
    root = tmp_path_factory.mktemp("example")
    source = shutil.copytree(
        EXAMPLE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    target = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*cmd, "--target", str(target), str(source)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


@pytest.fixture
def example_registry(example_site: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The example package on the path, its policies in the process registry and Hydra."""
    monkeypatch.syspath_prepend(str(example_site))
    reg = Registry.from_entry_points()
    reg.store_configs(ConfigStore.instance())
    monkeypatch.setattr(framework.plugin_host.registry, "_REGISTRY", reg)
    return reg


def test_example_plugin_loads_with_its_distribution(example_registry: Registry) -> None:
    reg = example_registry
    assert reg.load_errors == []
    assert reg.policies["scheduler"]["aged_sjf"].provider.distribution == EXAMPLE_DIST
    assert reg.policies["preemption"]["lowest_priority"].provider.distribution == EXAMPLE_DIST
    assert reg.observers["finish_log"][1].distribution == EXAMPLE_DIST
    assert f"aged_sjf ({EXAMPLE_DIST})" in reg.choices("scheduler")


def test_example_plugin_composes_validates_and_runs_in_process(
    example_registry: Registry, tiny: Any
) -> None:
    model, tok = tiny
    with pytest.raises(ConfigCompositionException) as info:
        make_cfg("model=tiny", "scheduler=aged_sjf", "scheduler.key=bogus")
    assert "expected one of [max_tokens, prompt_len, total]" in str(info.value.__cause__)
    with pytest.raises(ValueError, match=r"scheduler\.aging_s must be >= 0"):
        example_registry.build(
            "scheduler", make_cfg("scheduler=aged_sjf", "scheduler.aging_s=-1").scheduler
        )

    specs = tiny_specs([3, 0, 2, 1], [20, 20, 20, 20])
    cfg = make_cfg(
        "model=tiny",
        "scheduler=aged_sjf",
        "scheduler.key=total",
        "preemption=lowest_priority",
        "engine.num_blocks=6",
        "engine.block_size=16",
    )
    res = run_engine(cfg, model, tok, specs)
    assert {s.id for s in res.seqs if s.preemptions} == {"r0", "r2"}  # the least urgent
    assert summarize(res)["requests_finished"] == 4


def test_example_sjf_ages_long_waiters_to_the_front(example_registry: Registry) -> None:
    from nanoserve_example_plugin.sjf import AgedSJF, AgedSJFConfig, JobKey

    long_old = make_seq("long_old", max_tokens=50, arrival=0.0)
    short_new = make_seq("short_new", max_tokens=2, prompt_len=30, arrival=4.5)
    view = make_view((long_old, short_new), now=5.0)
    assert ids(AgedSJF(AgedSJFConfig(aging_s=10)).admit(view)) == ["short_new", "long_old"]
    assert ids(AgedSJF(AgedSJFConfig(aging_s=3)).admit(view)) == ["long_old", "short_new"]
    by_prompt = AgedSJF(AgedSJFConfig(key=JobKey.prompt_len, aging_s=10))
    assert ids(by_prompt.admit(view)) == ["long_old", "short_new"]


def run_cli(
    cwd_args: list[str], pythonpath: list[Path], timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    return subprocess.run(
        [sys.executable, "run.py", *cwd_args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_runs_the_installed_example_plugin(example_site: Path, tmp_path: Path) -> None:
    proc = run_cli(
        [
            *SJF_WORKLOAD,
            "scheduler=aged_sjf",
            "scheduler.key=max_tokens",
            "scheduler.aging_s=600",
            "preemption=lowest_priority",
            "observers=[console,finish_log]",
            f"hydra.run.dir={tmp_path}",
        ],
        [example_site],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["requests_finished"] == 4 and metrics["tokens_kept"] == 24
    assert csv_finish_order(tmp_path) == SJF_ORDER
    # The plugin's observer saw the same order through the hooks.
    assert json.loads((tmp_path / "finish_order.json").read_text()) == SJF_ORDER
    config = (tmp_path / "config.yaml").read_text()
    assert "name: aged_sjf" in config and "aging_s: 600.0" in config


def test_cli_sweeps_a_plugin_policy_and_a_built_in_one(example_site: Path, tmp_path: Path) -> None:
    # The console observer only: what is checked is each job's policy and finish order.
    # The default observers would draw and log every job (seconds each); a sweep's MLflow
    # parent and children are checked in tests/test_tracking.py.
    proc = run_cli(
        ["-m", *SJF_WORKLOAD, "scheduler=aged_sjf,continuous", "observers=[console]",
         f"hydra.sweep.dir={tmp_path}"],
        [example_site],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    orders = {}
    for job in sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit()):
        name = next(
            line
            for line in (job / "config.yaml").read_text().splitlines()
            if line.startswith("  name: ")
        )
        orders[name.split(": ")[1]] = csv_finish_order(job)
    assert orders == {"aged_sjf": SJF_ORDER, "continuous": FCFS_ORDER}


def test_cli_help_lists_plugins_and_reports_a_broken_one(
    example_site: Path, tmp_path: Path
) -> None:
    proc = run_cli(["--help"], [example_site, broken_dist(tmp_path / "broken")], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = choice_groups(proc.stdout)
    schedulers = {
        "aged_sjf",
        "chunked",
        "continuous",
        "lpm",
        "prefill_first",
        "priority",
        "sjf",
        "static",
    }
    assert set(groups["scheduler"]) == schedulers
    assert set(groups["preemption"]) == {"lowest_priority", "priority", "recompute"}
    # a third party's choice has its docstring's line and names its distribution
    assert groups["scheduler"]["aged_sjf"].startswith("Scheduler `aged_sjf`: shortest job first")
    assert f"[{EXAMPLE_DIST}]" in groups["scheduler"]["aged_sjf"]
    assert "finish_log" in proc.stdout
    assert (
        f"plugin 'broken' (nanoserve_broken_plugin) from distribution {BROKEN_DIST}" in proc.stderr
    )
    assert "ModuleNotFoundError: No module named 'nanoserve_missing_dependency'" in proc.stderr
    assert "written for policy API 99" in proc.stderr


def test_cli_unknown_policy_in_a_sweep_lists_providers(example_site: Path, tmp_path: Path) -> None:
    proc = run_cli(
        ["-m", "scheduler=aged_sjf,fifo", f"hydra.sweep.dir={tmp_path}"], [example_site], timeout=60
    )
    assert_refused(proc.returncode, proc.stderr, "unknown policy scheduler=fifo; scheduler offers")
    assert f"aged_sjf ({EXAMPLE_DIST})" in proc.stderr and "continuous (nanoserve)" in proc.stderr
    assert not any(tmp_path.iterdir())  # failed before any job started


def test_room_for_is_the_admission_test_and_evict_defaults_to_the_finished_rows() -> None:
    """`room_for` gives a request's tokens and blocks, or None where a row, the token budget,
    the blocks or the allocator says no; `admit_in_order` stops where it says None, and a
    scheduler that writes only `admit` releases every finished row."""
    a, b = make_seq("a", prompt_len=10), make_seq("b", prompt_len=30)
    view = make_view(waiting=(a, b), max_num_batched_tokens=40, price=lambda s: 2)
    assert room_for(view, a, 0, 0, 10) == (10, 2)
    assert room_for(view, b, 0, 10, 10) == (30, 2)
    assert room_for(view, b, 0, 11, 10) is None  # 41 tokens
    assert room_for(view, a, 8, 0, 10) is None  # every row taken
    assert room_for(view, a, 0, 0, 1) is None  # one block left, two asked
    assert ids(admit_in_order(view)) == ["a", "b"]
    assert ids(admit_in_order(make_view(waiting=(a, b), max_num_batched_tokens=39))) == ["a"]

    class AdmitOnly(Scheduler):
        def admit(self, view: EngineView) -> list[Sequence]:
            return admit_in_order(view)

    done = make_running("d", 0, max_tokens=1)
    done.output_token_ids.append(7)  # its one token sampled: owes no more
    live = make_running("l", 1)
    assert done.finished and not live.finished
    assert AdmitOnly(PolicyConfig()).evict(make_view(running=(done, live))) == [done]
