"""Replica failures on a simulated cluster (`cluster.faults`): every request of a 1,000-request
trace served exactly once, with the tokens of a fault-free run, whatever the router, the
fault times, the allocator, the scheduler and the output window; the real tiny model's greedy
tokens equal one engine's through a failure; requests wait while no replica is live; the
run folder records the failures; bad fault settings are one line."""

from __future__ import annotations

import csv
import json
import random
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from framework.cluster.outages import parse_outages
from framework.core.sequence import Status
from framework.run.summary import summarize
from framework.tracking.plots import save_run_plots
from tests.helpers import assert_refused, cli, make_cfg, spec, tokens
from tests.test_cluster import ROUTERS, SIM, FakeRay, runner

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shape() -> tuple[Any, Any]:
    from framework.run.app import load

    model, tokenizer, _, _ = load(make_cfg(*SIM))
    return model, tokenizer


# How long the trace arrives for: outages are drawn within it.
TRACE_S = 0.2


@pytest.fixture(scope="module")
def trace() -> list[Any]:
    """1,000 requests of 1-60 prompt tokens and 1-40 output tokens, one every 0.2 ms: on the
    tiny model's analytic H100 profile, about 0.2 s of a busy three-replica cluster. What
    the property needs is the rate (outages that strike while queues are long), not a
    longer trace: its cost is one simulated step per batch."""
    rng = random.Random(7)
    return [
        spec(
            i,
            [rng.randint(3, 400) for _ in range(rng.randint(1, 60))],
            rng.randint(1, 40),
            arrival=0.0002 * i,
        )
        for i in range(1000)
    ]


POOL = ("engine.block_size=4", "engine.num_blocks=200")


@pytest.fixture(scope="module")
def fault_free(shape: tuple[Any, Any], trace: list[Any]) -> dict[str, list[int]]:
    """The trace's tokens without a fault (the simulator draws each request's tokens from
    its own stream, so they do not depend on where it runs: `test_cluster`)."""
    return tokens(runner(shape, "cluster.replicas=3", *POOL).run(trace, shape[1].eos_token_id))


@st.composite
def outages(draw: st.DrawFn, replicas: int) -> list[dict[str, Any]]:
    """1-3 outages within the trace's arrivals, some for good (the rest for up to half of
    it), valid as a whole."""
    events = []
    for _ in range(draw(st.integers(1, 3))):
        down = draw(st.floats(0.0, TRACE_S))
        up = draw(st.one_of(st.none(), st.floats(0.001, TRACE_S / 2).map(lambda d, t=down: t + d)))
        events.append({"replica": draw(st.integers(0, replicas - 1)), "down_at_s": down,
                       "up_at_s": up})  # fmt: skip
    try:
        parse_outages(events, replicas)
    except ValueError:
        assume(False)
    return events


def faults_override(events: list[dict[str, Any]]) -> str:
    items = []
    for e in events:
        up = "null" if e["up_at_s"] is None else repr(e["up_at_s"])
        items.append(f"{{replica: {e['replica']}, down_at_s: {e['down_at_s']!r}, up_at_s: {up}}}")
    return f"cluster.faults=[{', '.join(items)}]"


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_trace_is_served_once_with_the_fault_free_tokens_through_failures(
    shape: tuple[Any, Any], trace: list[Any], fault_free: dict[str, list[int]], data: Any
) -> None:
    replicas = data.draw(st.integers(2, 4))
    events = data.draw(outages(replicas))
    window = data.draw(st.sampled_from([0, 1, 4]))
    over = (
        f"cluster.replicas={replicas}",
        f"router={data.draw(st.sampled_from(ROUTERS))}",
        f"allocator={data.draw(st.sampled_from(['incremental', 'prefix_cache', 'worst_case']))}",
        f"scheduler={data.draw(st.sampled_from(['continuous', 'chunked', 'sjf']))}",
        "output=deferred" if window else "output=immediate",
        f"window={window}",
        *POOL,
        faults_override(events),
    )
    # Invariants on: every replica's pool closes whole, tokens are conserved (the lost ones
    # counted), and the cluster checks each request was held once and lost only where it
    # had been placed (`check_served_once`).
    result = runner(shape, *over).run(trace, shape[1].eos_token_id)
    assert sorted(s.id for s in result.seqs) == sorted(s.id for s in trace)
    assert all(s.status is Status.RELEASED and s.finish_reason for s in result.seqs)
    assert tokens(result) == fault_free  # no token twice, none missing
    m = summarize(result)
    assert m["requests_finished"] == len(trace)
    assert m["replica_failures"] == len(result.outages) <= len(events)
    history = result.replicas_of
    assert m["requests_rerouted"] == sum(1 for h in history.values() if len(h) > 1)
    assert sum(o.requests_lost for o in result.outages) == sum(len(h) - 1 for h in history.values())
    for o in result.outages:  # a failure takes effect at its time or the end of a step
        configured = next(e for e in events if e["replica"] == o.replica and
                          e["down_at_s"] <= o.down_s)  # fmt: skip
        assert o.down_s >= configured["down_at_s"]
    lost = sum(1 for r in result.replicas for s in r.seqs if s.status is Status.MOVED)
    assert lost == sum(len(h) - 1 for h in history.values())
    if window == 0:
        assert m["tokens_lost_in_failure"] == 0  # nothing is ever held on the device


def test_the_real_model_gives_one_engines_greedy_tokens_through_a_failure(
    shape: tuple[Any, Any],
) -> None:
    """The tiny model in fp32 on two replicas taking turns; replica 1 fails 2 ms into the
    run (measured seconds: every request arrives at 0, so it is busy then) under a deferred
    window, so held tokens die with it: the re-routed requests, computed again from the
    tokens delivered, end with exactly one engine's greedy tokens."""
    from framework.run.app import build_runner, load

    real = (
        "model=tiny", "observers=[]", "engine.max_num_seqs=4", "output=deferred", "window=2",
        # kernels set, not measured at each engine's start (seconds each)
        "engine.packed_linears=false", "engine.paged_kernel=true", "engine.argmax_kernel=false",
        "engine.layer_glue=false",
    )  # fmt: skip
    cfg = make_cfg(*real)
    model, tokenizer, device, dtype = load(cfg)
    specs = [spec(i, [5 + i % 9] * (3 + i % 11), 16) for i in range(16)]
    eos = tokenizer.eos_token_id
    hooks = __import__("framework.plugin_host.registry", fromlist=["registry"]).registry().pm.hook
    alone = build_runner(cfg, model, device, dtype, hooks).run(specs, eos)
    faulted = make_cfg(
        *real, "cluster.replicas=2", "cluster.faults=[{replica: 1, down_at_s: 0.002}]"
    )
    result = build_runner(faulted, model, device, dtype, hooks).run(specs, eos)
    m = summarize(result)
    assert m["replica_failures"] == 1 and m["requests_rerouted"] >= 1
    assert m["tokens_recomputed_after_failure"] > 0
    assert tokens(result) == tokens(alone)


def test_requests_wait_while_no_replica_is_live(shape: tuple[Any, Any]) -> None:
    """Both replicas down from 10 ms; replica 1 back at 30 ms, replica 0 at 50 ms: what
    arrives meanwhile is placed on replica 1 when it is back, and nothing is lost."""
    specs = [spec(i, [7] * 8, 4, arrival=0.002 * i) for i in range(40)]
    faults = (
        "cluster.faults=[{replica: 0, down_at_s: 0.01, up_at_s: 0.05},"
        " {replica: 1, down_at_s: 0.01, up_at_s: 0.03}]"
    )
    result = runner(shape, "cluster.replicas=2", faults).run(specs, shape[1].eos_token_id)
    assert all(s.status is Status.RELEASED for s in result.seqs)
    for s in result.seqs:
        if 0.0101 < s.arrival < 0.03:
            assert result.replicas_of[s.id][-1] == 1
            assert s.admitted_at >= 0.03 and s.first_token_at >= 0.03
    assert [(o.replica, o.up_s) for o in result.outages] == [(0, 0.05), (1, 0.03)]


def test_the_run_folder_records_the_failures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = cli(
        capsys, *SIM, "cluster.replicas=3", "router=round_robin", "workload=synthetic",
        "workload.num_requests=200", "workload.arrival=burst", "output=deferred", "window=3",
        "cluster.faults=[{replica: 1, down_at_s: 0.001, up_at_s: 0.004}]",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["replica_failures"] == 1 and metrics["requests_rerouted"] > 0
    assert metrics["tokens_recomputed_after_failure"] > 0
    (outage,) = metrics["replica_outages"]
    assert outage["replica"] == 1 and outage["up_s"] == pytest.approx(0.004)
    assert outage["requests_lost"] == metrics["requests_rerouted"]
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    moved = [r for r in rows if " " in r["replicas"]]
    assert len(moved) == metrics["requests_rerouted"]
    for r in moved:
        placed = r["replicas"].split()
        assert placed[0] == "1" and placed[-1] == r["replica"] != "1"
    assert "replica_load.png" in {p.name for p in save_run_plots(tmp_path)}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["cluster.faults=[{replica: 3, down_at_s: 1}]"], "cluster.faults[0].replica must be"),
        (["cluster.faults=[{replica: 0, down_at_s: 2, up_at_s: 1}]"], "up_at_s must be after"),
        (["cluster.faults=[{replica: 0}]"], "cluster.faults[0].down_at_s is missing"),
        (["cluster.faults=[{replica: 0, down_at_s: 1, when: 2}]"], "unknown keys ['when']"),
        (
            ["cluster.faults=[{replica: 0, down_at_s: 1, up_at_s: 5}, {replica: 0, down_at_s: 2}]"],
            "replica 0's outages overlap",
        ),
        (
            ["cluster.faults=[{replica: 0, down_at_s: 1}, {replica: 1, down_at_s: 2}]"],
            "take every replica down for good",
        ),
        (["cluster.replicas=1", "cluster.faults=[{replica: 0, down_at_s: 1}]"], "replicas >= 2"),
        (["cluster.restart_replicas=1"], "restart_replicas applies to cluster.backend=ray"),
        (["cluster.restart_replicas=-1"], "restart_replicas must be an integer >= 0"),
        (
            ["cluster.prefill=1", "cluster.faults=[{replica: 0, down_at_s: 1, up_at_s: 2}]"],
            "replicas of one role",
        ),
    ],
)
def test_bad_fault_settings_are_one_line(
    capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    replicas = (
        [] if any(o.startswith("cluster.replicas") for o in overrides) else ["cluster.replicas=2"]
    )
    status, _, err = cli(capsys, *SIM, *replicas, *overrides)
    assert_refused(status, err, expected)


# ---- Ray replicas (`cluster.backend=ray`), driven in this process ------------------------
class ActorDied(Exception):
    """What a call to a killed actor raises (Ray's `RayActorError`)."""


class KillingRay(FakeRay):
    """`FakeRay` whose `kill` kills: a killed actor's calls raise, and its thread stops."""

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        handle.dead = True
        handle.obj.close()

    def wait(self, refs: list[Any], timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        return list(refs), []  # every call here has returned already

    def remote(self, **_: Any) -> Any:
        class Handle:
            dead = False

            def __init__(self, obj: Any) -> None:
                self.obj = obj

            def __getattr__(self, name: str) -> Any:
                method = getattr(self.obj, name)

                def call(*args: Any) -> Any:
                    if self.dead:
                        raise ActorDied(f"the actor died before {name}")
                    return method(*args)

                return types.SimpleNamespace(remote=call)

        return lambda cls: types.SimpleNamespace(remote=lambda *a: Handle(cls(*a)))


def ray_runner(monkeypatch: pytest.MonkeyPatch, *overrides: str) -> tuple[Any, Any, Any]:
    import sys

    from framework.plugin_host.registry import registry
    from framework.run.app import build_runner, load

    monkeypatch.setitem(sys.modules, "ray", KillingRay())
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    cfg = make_cfg("model=tiny", "cluster.replicas=2", "cluster.backend=ray", *overrides)
    model, tokenizer, _, _ = load(cfg, weights=False)
    run = build_runner(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    return run, tokenizer, cfg


def one_engine(specs: list[Any]) -> dict[str, list[int]]:
    from framework.plugin_host.registry import registry
    from framework.run.app import build_runner, load

    cfg = make_cfg("model=tiny", "observers=[]")
    model, tokenizer, _, _ = load(cfg)
    engine = build_runner(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    return tokens(engine.run(specs, tokenizer.eos_token_id))


RAY_SPECS = [spec(i, [5 + i % 7] * (4 + i % 9), 6 + i % 5, arrival=0.004 * i) for i in range(30)]


@pytest.fixture(scope="module")
def ray_reference() -> dict[str, list[int]]:
    """RAY_SPECS' tokens from one engine: what every failover below must end with (computed
    once for the module; each test's faulted run is its own)."""
    return one_engine(RAY_SPECS)


def test_a_ray_replica_killed_mid_run_loses_no_request(
    monkeypatch: pytest.MonkeyPatch, ray_reference: dict[str, list[int]]
) -> None:
    """Replica 1's actor is killed 40 ms in (`cluster.faults`): the driver finds it dead at
    its next call, routes what it owed to replica 0 from the prompts, and the run ends with
    every request served once and one engine's greedy tokens."""
    run, tokenizer, _ = ray_runner(monkeypatch, "cluster.faults=[{replica: 1, down_at_s: 0.04}]")
    result = run.run(RAY_SPECS, tokenizer.eos_token_id)
    assert sorted(s.id for s in result.seqs) == sorted(s.id for s in RAY_SPECS)
    assert all(s.status is Status.RELEASED for s in result.seqs)
    assert tokens(result) == ray_reference
    m = summarize(result)
    assert m["replica_failures"] == 1 and m["replica_outages"][0]["replica"] == 1
    assert m["tokens_recomputed_after_failure"] is None  # its counts died with it
    later = [s.id for s in RAY_SPECS if s.arrival > 0.05]
    assert all(result.replica_of[k] == 0 for k in later)  # nothing goes to the dead one
    moved = [k for k, v in result.replicas_of.items() if len(v) > 1]
    assert m["requests_rerouted"] == len(moved) == m["replica_outages"][0]["requests_lost"]
    assert all(result.replicas_of[k] == [1, 0] for k in moved)


def test_a_killed_ray_replica_is_restarted_empty_and_serves_again(
    monkeypatch: pytest.MonkeyPatch, ray_reference: dict[str, list[int]]
) -> None:
    """`cluster.restart_replicas=1`: replica 1 killed at 40 ms gets a new actor, which
    rejoins the router's view; requests arriving later reach it again."""
    run, tokenizer, _ = ray_runner(
        monkeypatch, "router=round_robin", "cluster.restart_replicas=1",
        "cluster.faults=[{replica: 1, down_at_s: 0.04}]",
    )  # fmt: skip
    first = run.actors[1]
    result = run.run(RAY_SPECS, tokenizer.eos_token_id)
    assert run.actors[1] is not first and first.dead
    assert tokens(result) == ray_reference
    (outage,) = summarize(result)["replica_outages"]
    assert outage["replica"] == 1 and outage["down_s"] <= outage["up_s"]
    later = [s.id for s in RAY_SPECS if s.arrival > 0.06]
    assert {result.replica_of[k] for k in later} == {0, 1}  # round robin over both again


def test_a_ray_replica_whose_engine_raises_is_lost_and_its_requests_served(
    monkeypatch: pytest.MonkeyPatch, ray_reference: dict[str, list[int]]
) -> None:
    run, tokenizer, _ = ray_runner(monkeypatch, "router=round_robin")
    engine = run.actors[1].obj.engine
    steps = {"n": 0}
    advance = engine.advance

    def failing() -> Any:
        steps["n"] += 1
        if steps["n"] > 5:
            raise RuntimeError("the device fell off the bus")
        return advance()

    engine.advance = failing
    result = run.run(RAY_SPECS, tokenizer.eos_token_id)
    assert tokens(result) == ray_reference
    (outage,) = summarize(result)["replica_outages"]
    assert outage["replica"] == 1 and outage["requests_lost"] > 0


def test_every_ray_replica_lost_ends_in_one_line_with_what_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from framework.run.errors import RunStopped

    faults = "cluster.faults=[{replica: 0, down_at_s: 0.06}, {replica: 1, down_at_s: 0.06}]"
    with pytest.raises(ValueError, match="every replica down for good"):
        ray_runner(monkeypatch, faults)  # refused before anything runs
    run, tokenizer, _ = ray_runner(monkeypatch, "cluster.faults=[{replica: 1, down_at_s: 0.03}]")
    outage, waited = type(run.kills[0]), run._wait_until

    def wait_until(t: float) -> None:
        # The other one too, as a crash would, once a request has finished (not at a fixed
        # time: on a loaded machine none might have finished by then).
        if run.done and not run.kills and len(run.live) == 1:
            run.kills.append(outage(0, run._elapsed()))
        waited(t)

    monkeypatch.setattr(run, "_wait_until", wait_until)
    # Arrivals spread over 1.5 s: the last ones come after the loss, so some never finish.
    specs = [replace(s, arrival=0.05 * i) for i, s in enumerate(RAY_SPECS)]
    with pytest.raises(RunStopped, match="every replica was lost") as stopped:
        run.run(specs, tokenizer.eos_token_id)
    assert "\n" not in str(stopped.value)
    partial = run.partial_result()
    assert 0 < len(partial.seqs) < len(specs)
    assert all(s.status is Status.RELEASED and s.finish_reason == "length" for s in partial.seqs)


def test_a_ray_run_that_loses_every_replica_is_one_line_and_an_incomplete_folder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Both replicas' engines raise at once: the driver loses both, the command line says
    so in one line (exit 1, no traceback), and the run folder is written, marked
    incomplete."""
    import sys

    from framework.run.ray_actor import ReplicaActor

    monkeypatch.setitem(sys.modules, "ray", KillingRay())
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setattr(
        ReplicaActor, "_loop", lambda self: setattr(self, "error", RuntimeError("no device"))
    )
    status, _, err = cli(
        capsys, "model=tiny", "workload=straggler", "cluster.replicas=2", "cluster.backend=ray",
        "observers=[]", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 1 and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("error: cluster.backend=ray: every replica was lost")
    assert "no device" in lines[-1]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["incomplete"] is True and metrics["replica_failures"] == 2
