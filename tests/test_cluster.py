"""A cluster of simulated replicas behind a router: every request served once, the replicas'
counts adding up to the totals, every pool's books closed, the same tokens as one engine;
one replica is the engine itself; each router's rule on a constructed case; a router that
breaks its contract is stopped by name; bad cluster settings are one line."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework.api import ClusterView, RouterConfig
from framework.api.policy import PolicyError
from framework.cluster.group import Cluster
from framework.cluster.result import ClusterResult
from framework.plugin_host.registry import registry
from framework.run.app import build_runner, load
from framework.run.cluster_run import ClusterRunner, build_router
from framework.run.summary import summarize
from framework.tracking.plots import PLOTS, save_run_plots
from tests.helpers import assert_refused, cli, draw_specs, make_cfg, spec, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

ROUTERS = (
    "round_robin", "random", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware",
)  # fmt: skip
SIM = ("model=tiny", "executor=simulated", "executor.host_time=model", "observers=[]")


@pytest.fixture(scope="module")
def shape() -> tuple[Any, Any]:
    """The tiny model's shape and tokenizer, as a simulated run loads them."""
    model, tokenizer, _, _ = load(make_cfg(*SIM))
    return model, tokenizer


def runner(shape: tuple[Any, Any], *overrides: str) -> Any:
    cfg = make_cfg(*SIM, *overrides)
    model, _ = shape
    return build_runner(cfg, model, torch_cpu(), dtype_of(cfg), registry().pm.hook)


def torch_cpu() -> Any:
    import torch

    return torch.device("cpu")


def dtype_of(cfg: Any) -> Any:
    import torch

    return getattr(torch, cfg.dtype)


def test_one_replica_behind_a_router_is_the_engine(shape: tuple[Any, Any]) -> None:
    """The cluster's loop over one engine takes exactly the engine's own steps."""
    specs = [spec(i, [5 + i] * (3 + 2 * i), 4 + i, arrival=0.001 * i) for i in range(8)]
    over = ("engine.max_num_seqs=3", "output=deferred", "window=2")
    alone = runner(shape, *over).run(specs, shape[1].eos_token_id)
    engine = runner(shape, *over)
    router, name, provider = build_router(make_cfg(*SIM))
    result = Cluster([engine], router, name, provider).run(specs, shape[1].eos_token_id)
    one = result.replicas[0]
    assert tokens(one) == tokens(alone)
    assert [st_.time for st_ in one.steps] == [st_.time for st_ in alone.steps]
    assert summarize(one) == summarize(alone)
    assert set(result.replica_of.values()) == {0}


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_every_request_is_served_once_and_the_replicas_add_up(
    shape: tuple[Any, Any], data: st.DataObject
) -> None:
    specs = draw_specs(data, 12)
    replicas = data.draw(st.integers(1, 4))
    over = (
        f"cluster.replicas={replicas}",
        f"router={data.draw(st.sampled_from(ROUTERS))}",
        f"allocator={data.draw(st.sampled_from(['incremental', 'prefix_cache', 'worst_case']))}",
        f"scheduler={data.draw(st.sampled_from(['continuous', 'chunked', 'lpm', 'static']))}",
        f"engine.max_num_seqs={data.draw(st.integers(1, 4))}",
        "engine.block_size=4",
        f"engine.num_blocks={data.draw(st.sampled_from([16, 40, 200]))}",
    )
    eos = shape[1].eos_token_id
    result = runner(shape, *over).run(specs, eos)  # invariants on: each pool's books close
    alone = runner(shape, *over[2:]).run(specs, eos)
    assert sorted(s.id for s in result.seqs) == sorted(s.id for s in specs)
    assert tokens(result) == tokens(alone)  # the same draws wherever a request runs
    total = summarize(result)
    if replicas == 1:
        assert not isinstance(result, ClusterResult)  # one engine carries no cluster fields
        return
    parts = total["replicas"]
    assert len(parts) == replicas and total["cluster_replicas"] == replicas
    for key in ("requests", "requests_finished", "requests_rejected", "steps", "tokens_kept",
                "prefill_tokens", "preemptions", "num_blocks"):  # fmt: skip
        assert sum(p[key] for p in parts) == total[key], key
    assert {s.id: result.replica_of[s.id] for s in result.seqs} == result.replica_of
    assert total["load_imbalance"] >= 1.0


def test_prefix_aware_sends_a_shared_prefix_to_the_replica_that_holds_it(
    shape: tuple[Any, Any],
) -> None:
    """Replica 0 runs a long request D; A (a 32-token prompt) goes to the idle replica 1 and
    leaves its blocks cached there; E (long) joins replica 1, so both replicas hold one
    request. B shares A's first 28 tokens: the least loaded rule (a tie: replica 0) and
    round-robin send it elsewhere, prefix_aware to replica 1, where it hits the cache."""
    a = list(range(100, 132))
    b = [*a[:28], 7, 7, 7, 7, 7, 7]
    specs = [
        spec(0, [3] * 8, 300, arrival=0.0),  # D
        spec(1, a, 1, arrival=0.0001),  # A
        spec(2, [4] * 8, 300, arrival=0.01),  # E
        spec(3, b, 2, arrival=0.02),  # B
    ]
    common = ("cluster.replicas=2", "allocator=prefix_cache", "engine.block_size=4")
    eos = shape[1].eos_token_id
    aware = runner(shape, *common, "router=prefix_aware").run(specs, eos)
    assert aware.replica_of == {"r0": 0, "r1": 1, "r2": 1, "r3": 1}
    assert summarize(aware)["replicas"][1]["prefix_hit_rate"] > 0
    least = runner(shape, *common, "router=least_outstanding").run(specs, eos)
    assert least.replica_of["r3"] == 0
    assert summarize(least)["prefix_hit_tokens"] == 0


def test_each_load_router_reads_its_own_measure() -> None:
    """On a hand-made view: fewest requests, fewest tokens, two seeded draws."""
    from plugins.routers.least_loaded import LeastOutstandingRouter, LeastTokensRouter
    from plugins.routers.power_of_two import PowerOfTwoRouter
    from plugins.routers.round_robin import RoundRobinRouter

    class View:
        def __init__(self, index: int, outstanding: int, tokens: int) -> None:
            self.index, self.outstanding, self.outstanding_tokens = index, outstanding, tokens

    replicas = (View(0, 3, 10), View(1, 1, 900), View(2, 2, 50))
    view = ClusterView(0.0, replicas)  # type: ignore[arg-type]
    request = spec(0, [1, 2, 3], 4)
    assert LeastOutstandingRouter(RouterConfig("least_outstanding")).route(view, request) == 1
    assert LeastTokensRouter(RouterConfig("least_tokens")).route(view, request) == 0
    rr = RoundRobinRouter(RouterConfig("round_robin"))
    assert [rr.route(view, request) for _ in range(5)] == [0, 1, 2, 0, 1]
    p2 = PowerOfTwoRouter(RouterConfig("power_of_two", seed=3))
    again = PowerOfTwoRouter(RouterConfig("power_of_two", seed=3))
    picks = [p2.route(view, request) for _ in range(20)]
    assert picks == [again.route(view, request) for _ in range(20)]
    assert 0 not in picks  # replica 0 is the more loaded of any pair it is drawn in


@pytest.mark.usefixtures("router_plugin")
def test_a_third_party_router_runs_from_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = cli(
        capsys, *SIM, "workload=straggler", "cluster.replicas=3", "router=always_last",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert status == 0, err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["requests"] for r in metrics["replicas"]] == [0, 0, 8]
    lines = (tmp_path / "requests.csv").read_text().splitlines()
    assert lines[0].endswith(",replica,replicas") and all(x.endswith(",2,2") for x in lines[1:])
    steps = (tmp_path / "steps.csv").read_text().splitlines()
    assert steps[0].endswith(",replica") and len(steps) == metrics["steps"] + 1
    drawn = {p.name for p in save_run_plots(tmp_path)}
    assert drawn == {*PLOTS, "replica_load.png"}


@pytest.mark.usefixtures("router_plugin")
def test_a_router_decision_out_of_range_is_stopped_by_name(shape: tuple[Any, Any]) -> None:
    run = runner(shape, "cluster.replicas=2", "router=off_the_end")
    assert isinstance(run, ClusterRunner)
    with pytest.raises(
        PolicyError,
        match=r"router policy 'off_the_end' \(nanoserve-routers-ext\): .*replica 2; the "
        r"cluster has replicas 0\.\.1",
    ):
        run.run([spec(0, [3, 4], 2)], shape[1].eos_token_id)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["cluster.replicas=0"], "cluster.replicas must be an integer >= 1; got 0"),
        (["router=nearest"], "unknown policy router=nearest"),
        (["router=prefix_aware", "router.min_match=2"], "router.min_match must be in [0, 1]"),
        (["cluster.backend=spark"], "cluster.backend must be local (every replica in this"),
        (["cluster.backend=ray"], "cluster.backend=ray runs replicas of the real executor"),
        (
            ["executor=model", "cluster.backend=ray", "cluster.ray_address=nowhere"],
            "cluster.ray_address must be null, auto or HOST:PORT",
        ),
    ],
)
def test_bad_cluster_input_is_one_line(
    capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    base = [a for a in SIM if not (a.startswith("executor=") and "executor=model" in overrides)]
    status, _, err = cli(capsys, *base, *overrides)
    assert_refused(status, err, expected)


def test_real_replicas_take_turns_in_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    """`executor=model` with local replicas: each replica an engine over the one loaded
    model, on a clock of its own steps' measured time. The same greedy tokens as one
    engine, every request served once, the replicas adding up, and one line saying how
    its times were taken."""
    real = ("model=tiny", "observers=[]", "engine.max_num_seqs=2")
    cfg = make_cfg(*real, "cluster.replicas=2", "router=least_outstanding")
    model, tokenizer, device, dtype = load(cfg)
    specs = [spec(i, [7 + i] * (2 + i), 3 + i, arrival=0.0) for i in range(6)]
    run = build_runner(cfg, model, device, dtype, registry().pm.hook)
    assert isinstance(run, ClusterRunner)
    assert "take turns in this process" in capsys.readouterr().err
    result = run.run(specs, tokenizer.eos_token_id)
    alone = build_runner(make_cfg(*real), model, device, dtype, registry().pm.hook)
    assert tokens(result) == tokens(alone.run(specs, tokenizer.eos_token_id))
    total = summarize(result)
    assert total["clock"] == "virtual" and total["cluster_replicas"] == 2
    assert all(part["requests"] > 0 for part in total["replicas"])
    for key in ("requests", "steps", "tokens_kept", "prefill_tokens"):
        assert sum(part[key] for part in total["replicas"]) == total[key], key


def test_a_paused_replica_clock_counts_none_of_the_others_time() -> None:
    """Under measured host time the real time between a replica's own steps is another
    replica's work: paused, its clock stands still; resumed, it flows from then."""
    from framework.engine.clock import VirtualClock

    t = [0.0]
    clock = VirtualClock(timer=lambda: t[0])
    clock.start()
    t[0] = 1.0
    assert clock.now() == 1.0
    clock.pause()
    t[0] = 5.0
    assert clock.now() == 1.0
    clock.resume()
    t[0] = 6.5
    assert clock.now() == 2.5


class FakeRay:
    """Ray's calls as `RayRunner` makes them, run in this process: what `ray.init` was asked
    and which auth token path it saw, actors built and called in place."""

    def __init__(self) -> None:
        self.init_kwargs: dict[str, Any] = {}
        self.token_at_init: str | None = None
        self.shut = False

    def init(self, **kwargs: Any) -> None:
        import os

        self.init_kwargs = kwargs
        path = os.environ.get("RAY_AUTH_TOKEN_PATH")
        self.token_at_init = Path(path).read_text() if path else None

    def shutdown(self) -> None:
        self.shut = True

    def get(self, value: Any) -> Any:
        return value

    def remote(self, **_: Any) -> Any:
        class Handle:
            def __init__(self, obj: Any) -> None:
                self.obj = obj

            def __getattr__(self, name: str) -> Any:
                return types.SimpleNamespace(remote=getattr(self.obj, name))

        return lambda cls: types.SimpleNamespace(remote=lambda *a: Handle(cls(*a)))


def test_ray_replicas_of_their_own_stay_on_loopback_and_out_of_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no `cluster.ray_address` the run starts Ray for itself: on 127.0.0.1, with its
    auth token in a folder of the run's (Ray would write it to ~/.ray, where every later Ray
    client of the user picks it up), removed at the end. The replicas' results come back
    merged, every request served once, the same tokens as one engine."""
    import os
    import sys

    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    cfg = make_cfg("model=tiny", "workload=straggler", "cluster.replicas=2", "cluster.backend=ray")
    model, tokenizer, _, _ = load(cfg, weights=False)
    run = build_runner(cfg, model, torch_cpu(), dtype_of(cfg), registry().pm.hook)
    specs = [spec(i, [5 + i] * 6, 3 + i) for i in range(5)]
    result = run.run(specs, tokenizer.eos_token_id)
    assert fake.init_kwargs["_node_ip_address"] == "127.0.0.1"
    assert fake.init_kwargs["address"] is None
    assert fake.token_at_init and len(fake.token_at_init) == 64
    assert fake.shut and "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert sorted(result.replica_of.values()) == [0, 0, 0, 1, 1]  # round-robin
    assert sum(r["requests"] for r in summarize(result)["replicas"]) == 5
    one = make_cfg("model=tiny", "workload=straggler")
    real, _, _, _ = load(one)
    engine = build_runner(one, real, torch_cpu(), dtype_of(one), registry().pm.hook)
    assert tokens(result) == tokens(engine.run(specs, tokenizer.eos_token_id))
