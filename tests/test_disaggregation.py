"""Prefill/decode disaggregation on a simulated cluster: each request prefilled once and
decoded once, with one engine's tokens and every pool's books closed; a lone transfer takes
latency + bytes / bandwidth; sharing the link never finishes a transfer sooner; layer-wise
overlap is never slower; all-`mixed` roles are the plain cluster; a decode replica that
declines keeps the request waiting at its prefill replica; bad settings are one line."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework.api.policy import PolicyError
from framework.cluster.link import Link, Overlap, Transfer, overlapped_bytes
from framework.core.sequence import Status
from framework.plugin_host.registry import registry
from framework.run.app import build_runner, load
from framework.run.cluster_run import ClusterRunner
from framework.run.summary import summarize
from framework.tracking import replica_plots
from framework.tracking.figures import save_figure
from framework.tracking.plots import read_step_columns
from framework.tracking.replica_plots import plot_replica_load, transfers_in_flight
from tests.helpers import assert_refused, cli, draw_specs, make_cfg, spec, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

ROUTERS = (
    "round_robin", "random", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware",
)  # fmt: skip
SIM = ("model=tiny", "executor=simulated", "executor.host_time=model", "observers=[]")
# The tiny model's KV a token: 2 layers x 2 KV heads x head dim 16 x 4 bytes (fp32) x 2.
KV_BYTES_PER_TOKEN = 2 * 2 * 16 * 4 * 2


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height in pixels, from its header (which must be a PNG's)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path}: not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.fixture(scope="module")
def shape() -> tuple[Any, Any]:
    model, tokenizer, _, _ = load(make_cfg(*SIM))
    return model, tokenizer


def runner(shape: tuple[Any, Any], *overrides: str) -> Any:
    import torch

    cfg = make_cfg(*SIM, *overrides)
    return build_runner(cfg, shape[0], torch.device("cpu"), torch.float32, registry().pm.hook)


def roles_of(n: int, draw: Any) -> list[str]:
    """n roles with a prefill replica and a decode-capable one."""
    roles = [draw(st.sampled_from(["prefill", "decode", "mixed"])) for _ in range(n)]
    roles[0] = "prefill"
    if not any(r in ("decode", "mixed") for r in roles[1:]):
        roles[-1] = draw(st.sampled_from(["decode", "mixed"]))
    return roles


def test_the_tiny_models_kv_weighs_what_the_test_assumes(shape: tuple[Any, Any]) -> None:
    c = shape[0].config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4 == KV_BYTES_PER_TOKEN


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_each_request_is_prefilled_once_and_decoded_once_with_one_engines_tokens(
    shape: tuple[Any, Any], data: st.DataObject
) -> None:
    specs = draw_specs(data, 10, eos_drawn=True)
    replicas = data.draw(st.integers(2, 4))
    roles = roles_of(replicas, data.draw)
    policies = (
        f"allocator={data.draw(st.sampled_from(['incremental', 'prefix_cache', 'worst_case']))}",
        f"scheduler={data.draw(st.sampled_from(['continuous', 'chunked', 'lpm', 'static']))}",
        f"output={data.draw(st.sampled_from(['immediate', 'deferred']))}",
        f"engine.max_num_seqs={data.draw(st.integers(1, 4))}",
        "engine.block_size=4",
        f"engine.num_blocks={data.draw(st.sampled_from([16, 40, 200]))}",
        "executor.mean_output_tokens=4",
    )
    cluster = (
        f"cluster.replicas={replicas}",
        f"cluster.roles=[{','.join(roles)}]",
        f"router={data.draw(st.sampled_from(ROUTERS))}",
        f"router.decode={data.draw(st.sampled_from(ROUTERS))}",
        f"cluster.link={data.draw(st.sampled_from(['nvlink', 'infiniband', 'pcie', 'ethernet']))}",
        f"cluster.layerwise={data.draw(st.booleans())}",
    )
    eos = shape[1].eos_token_id
    result = runner(shape, *policies, *cluster).run(specs, eos)  # every book checked
    alone = runner(shape, *policies).run(specs, eos)
    assert tokens(result) == tokens(alone)  # the same draws on either side of a transfer
    assert [s.id for s in result.seqs] == [s.id for s in specs]
    moved = {t.id: t for t in result.transfers}
    assert len(moved) == len(result.transfers) <= len(specs)  # each request moved at most once
    assert moved.keys() == result.decode_of.keys()
    by_id = {s.id: s for s in result.seqs}
    for s in specs:
        prefill = result.replica_of[s.id]
        assert roles[prefill] in ("prefill", "mixed")
        seq = by_id[s.id]
        if seq.status is Status.REJECTED:
            assert s.id not in moved
        elif roles[prefill] == "mixed" or len(seq.output_token_ids) == 1:
            assert s.id not in moved  # served whole where it was prefilled
        else:  # prefilled there, decoded on a decode-capable replica from its second token
            t = moved[s.id]
            assert (t.src, t.dst) == (prefill, result.decode_of[s.id])
            assert roles[t.dst] in ("decode", "mixed") and seq.carried == 1
            assert t.bytes == len(s.prompt_token_ids) * KV_BYTES_PER_TOKEN
            assert t.handed_at <= t.start <= t.done_at <= seq.token_times[1]
    total = summarize(result)
    parts = total["replicas"]
    assert [p["role"] for p in parts] == roles
    for key in ("requests_finished", "requests_rejected", "steps", "tokens_kept",
                "prefill_tokens", "preemptions", "num_blocks"):  # fmt: skip
        assert sum(p[key] for p in parts) == total[key], key
    assert sum(p["requests"] for p in parts) == total["requests"] + total["kv_transfers"]
    assert total["kv_transfer_bytes"] == sum(t.bytes for t in moved.values())
    for part, role in zip(parts, roles, strict=True):
        if role == "decode" and not part["preemptions"]:
            assert part["prefill_tokens"] == 0  # a landed prompt is never computed again
        if role == "prefill":
            assert part["tokens_kept"] == part["requests"] - part["requests_rejected"]


def test_a_lone_transfer_takes_latency_plus_bytes_over_bandwidth(shape: tuple[Any, Any]) -> None:
    """One request over a link of 100 Gbit/s and 7 us: its transfer takes exactly that."""
    over = ("cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link=ethernet")
    specs = [spec(0, list(range(10, 74)), 5)]
    result = runner(shape, *over, "cluster.link_gbps=100", "cluster.link_latency_us=7").run(
        specs, shape[1].eos_token_id
    )
    (t,) = result.transfers
    assert t.bytes == 64 * KV_BYTES_PER_TOKEN
    assert t.seconds == pytest.approx(7e-6 + t.bytes / (100e9 / 8), rel=1e-12)
    assert t.start == t.handed_at == result.seqs[0].first_token_at
    link = Link(bandwidth=3.0, latency=0.5)
    lone = Transfer(0, 1, 6.0, start=2.0)
    assert run_link(link, [lone]) == [pytest.approx(2.0 + 0.5 + 6.0 / 3.0, rel=1e-15)]


def run_link(link: Link, transfers: list[Transfer]) -> list[float]:
    """Every transfer through the link; each one's done time, in the order given."""
    for t in transfers:
        link.send(t)
    while link.busy:
        link.advance(link.next_time())
    return [t.done_at for t in transfers]  # type: ignore[misc]


def transfer_list(draw: Any, n: int) -> list[tuple[int, int, float, float]]:
    out = []
    for _ in range(n):
        src = draw(st.integers(0, 3))
        dst = draw(st.integers(0, 3).filter(lambda d, s=src: d != s))
        out.append((src, dst, draw(st.floats(1.0, 1e6)), draw(st.floats(0.0, 1e-3))))
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_more_transfers_never_finish_a_transfer_sooner(data: st.DataObject) -> None:
    """Sharing: a transfer's rate is the smaller of its ports' equal shares, so more
    transfers on the link (at any time, on any ports) only ever slow the others."""
    base = transfer_list(data.draw, data.draw(st.integers(1, 6)))
    extra = transfer_list(data.draw, data.draw(st.integers(1, 4)))
    layered = data.draw(st.booleans())

    def make(rows: list[tuple[int, int, float, float]]) -> list[Transfer]:
        over = Overlap(2e-4, 8) if layered else None
        return [Transfer(s, d, b, start=t0, overlap=over) for s, d, b, t0 in rows]

    alone = run_link(Link(1e9, 1e-6), make(base))
    shared = run_link(Link(1e9, 1e-6), make(base + extra))[: len(base)]
    for a, b in zip(alone, shared, strict=True):
        assert b >= a * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_layerwise_overlap_is_never_slower_than_none(data: st.DataObject) -> None:
    rows = transfer_list(data.draw, data.draw(st.integers(1, 6)))
    layers = data.draw(st.integers(1, 80))
    layer_s = data.draw(st.floats(0.0, 1e-3))
    plain = run_link(Link(1e9, 1e-6), [Transfer(s, d, b, t0) for s, d, b, t0 in rows])
    over = Overlap(layer_s, layers)
    layered = run_link(
        Link(1e9, 1e-6), [Transfer(s, d, b, t0, overlap=over) for s, d, b, t0 in rows]
    )
    for a, b in zip(plain, layered, strict=True):
        assert b <= a * (1 + 1e-12)
    sent = overlapped_bytes(1000.0, over, 1e6)
    assert 0.0 <= sent <= 1000.0 * (layers - 1) / layers + 1e-9  # the last layer is left


def test_layerwise_overlap_shortens_a_transfer_on_the_cluster(shape: tuple[Any, Any]) -> None:
    over = ("cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link=ethernet")
    specs = [spec(0, list(range(10, 522)), 3)]
    eos = shape[1].eos_token_id
    whole = runner(shape, *over).run(specs, eos).transfers[0]
    layered = runner(shape, *over, "cluster.layerwise=true").run(specs, eos).transfers[0]
    assert layered.seconds < whole.seconds
    assert layered.bytes == whole.bytes


def test_all_mixed_roles_are_the_plain_cluster(shape: tuple[Any, Any]) -> None:
    """Roles that are all `mixed`: the same routing, steps, times and counts as no roles."""
    specs = [spec(i, [5 + i] * (3 + 5 * i), 4 + i, arrival=0.001 * i) for i in range(9)]
    over = ("cluster.replicas=3", "router=least_tokens", "output=deferred", "window=2")
    eos = shape[1].eos_token_id
    plain = runner(shape, *over).run(specs, eos)
    mixed = runner(shape, *over, "cluster.roles=[mixed,mixed,mixed]").run(specs, eos)
    assert tokens(mixed) == tokens(plain)
    assert mixed.replica_of == plain.replica_of
    assert [s.values() for s in mixed.steps] == [s.values() for s in plain.steps]
    a, b = summarize(plain), summarize(mixed)
    assert [{k: v for k, v in r.items() if k != "role"} for r in b.pop("replicas")] == a.pop(
        "replicas"
    )
    assert a == b and mixed.transfers is None


def test_a_decode_replica_short_of_blocks_keeps_the_request_at_its_prefill_replica(
    shape: tuple[Any, Any],
) -> None:
    """A decode pool of 8 blocks of 4 tokens holds the KV of two of these requests at a
    time: the rest wait at the prefill replica, their blocks held there (which in turn
    keeps later prompts out of its pool), and every one still completes, with one
    engine's tokens."""
    over = (
        "cluster.replicas=2", "cluster.roles=[prefill,decode]", "engine.block_size=4",
        "engine.num_blocks=8", "cluster.link=pcie",
    )  # fmt: skip
    specs = [spec(i, [7 + i] * 8, 12) for i in range(6)]
    eos = shape[1].eos_token_id
    result = runner(shape, *over).run(specs, eos)
    alone = runner(shape, "engine.block_size=4", "engine.num_blocks=8").run(specs, eos)
    assert tokens(result) == tokens(alone)
    assert all(s.status is Status.RELEASED for s in result.seqs)
    waits = [t.wait_s for t in result.transfers]
    assert len(waits) == 6 and max(waits) > 0
    metrics = summarize(result)
    assert metrics["kv_wait_s_p99"] > 0 and metrics["kv_transfers"] == 6


def test_a_prefill_replica_full_of_requests_to_send_waits_for_their_transfers(
    shape: tuple[Any, Any],
) -> None:
    """`long` fills the decode pool (5 of 8 blocks, growing), so the 4-block reservations of
    the 12-token prompts are declined. They wait at the prefill replica, 3 blocks each:
    two of them fill its pool and the later ones cannot be admitted (the replica idles,
    stalled), until transfers free its blocks; every one completes, one engine's tokens."""
    common = ("engine.block_size=4", "engine.num_blocks=8")
    specs = [spec(0, [5] * 16, 12)]
    specs += [spec(1 + i, [9 + i] * 12, 3, arrival=0.002 + 0.0001 * i) for i in range(6)]
    eos = shape[1].eos_token_id
    result = runner(shape, "cluster.replicas=2", "cluster.roles=[prefill,decode]", *common).run(
        specs, eos
    )
    assert tokens(result) == tokens(runner(shape, *common).run(specs, eos))
    moved = {t.id: t for t in result.transfers}
    assert len(moved) == 7 and moved["r1"].wait_s > 0
    admitted = {s.id: s.admitted_at for s in result.seqs}
    freed = sorted(t.done_at for t in result.transfers)
    late = [i for i, a in admitted.items() if a is not None and a > 0.003]
    assert late and all(any(f <= admitted[i] for f in freed[1:]) for i in late)


def test_a_decode_replica_waits_for_a_landing_to_readmit_what_it_preempted(
    shape: tuple[Any, Any],
) -> None:
    """`a` lands on the decode replica (5 of 8 blocks) and decodes; `b`, handed off later,
    reserves the other 3 while its KV crosses a link of 60 ms latency. `a` needs a sixth
    block: it is preempted, and its recompute does not fit beside `b`'s reservation, so the
    decode replica idles until `b` lands, runs and finishes; then `a` resumes."""
    common = ("engine.block_size=4", "engine.num_blocks=8")
    specs = [spec(0, [7] * 16, 12), spec(1, [9] * 8, 2, arrival=0.05)]
    over = ("cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link_latency_us=60000")
    eos = shape[1].eos_token_id
    result = runner(shape, *over, *common).run(specs, eos)
    assert tokens(result) == tokens(runner(shape, *common).run(specs, eos))
    a, b = result.seqs
    landed_b = next(t.done_at for t in result.transfers if t.id == "r1")
    assert a.preemptions == 1 and summarize(result)["replicas"][1]["preemptions"] == 1
    gap = next(i for i in range(1, len(a.token_times)) if a.token_times[i] > landed_b)
    assert a.token_times[gap - 1] < landed_b < b.finished_at <= a.token_times[gap]


class Decliner:
    """An allocator that prices like incremental and admits nothing."""

    def blocks_to_admit(self, seq: Any, block_size: int) -> int:
        return -(-seq.num_tokens // block_size)

    def admits(self, view: Any, seq: Any, free_blocks: int) -> bool:
        return False


def test_a_decode_replica_that_always_declines_stops_the_run_by_name(
    shape: tuple[Any, Any],
) -> None:
    run = runner(shape, "cluster.replicas=2", "cluster.roles=[prefill,decode]")
    assert isinstance(run, ClusterRunner)
    run.engines[1].p.use("allocator", Decliner(), "decliner")
    with pytest.raises(PolicyError, match="every decode-capable replica is idle"):
        run.run([spec(0, [3, 4, 5], 4)], shape[1].eos_token_id)


@pytest.mark.usefixtures("router_plugin")
def test_a_decode_choice_out_of_range_is_stopped_by_name(shape: tuple[Any, Any]) -> None:
    run = runner(
        shape, "cluster.replicas=3", "cluster.roles=[prefill,decode,mixed]",
        "router.decode=off_the_end",
    )  # fmt: skip
    with pytest.raises(
        PolicyError,
        match=r"router policy 'off_the_end' \(nanoserve-routers-ext\) \(router\.decode\): "
        r"chose 2 for r0's decode; its view has decode-capable replicas 0\.\.1",
    ):
        run.run([spec(0, [3, 4], 3)], shape[1].eos_token_id)


def test_a_disaggregated_run_from_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, _, err = cli(
        capsys, *SIM, "workload=straggler", "cluster.replicas=3", "cluster.prefill=1",
        "cluster.decode=2", "router.decode=least_outstanding", "cluster.link=infiniband",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert status == 0, err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["kv_transfers"] == 8 and metrics["requests_finished"] == 8
    assert metrics["kv_transfer_s_p99"] >= metrics["kv_transfer_s_p50"] > 0
    assert metrics["link"] == "infiniband" and metrics["link_gbyte_s"] == 50.0
    assert [r["role"] for r in metrics["replicas"]] == ["prefill", "decode", "decode"]
    assert [r["requests"] for r in metrics["replicas"]][1:] == [4, 4]  # spread by the router
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["replica"] for r in rows} == {"0"}
    assert sorted(r["decode_replica"] for r in rows) == ["1"] * 4 + ["2"] * 4
    assert all(float(r["kv_transfer_s"]) > 0 for r in rows)
    for r in rows:  # the transfer on the run's time axis: after the first token, before the end
        start, done = float(r["kv_start_s"]), float(r["kv_done_s"])
        assert float(r["first_token_s"]) <= start < done <= float(r["finished_s"])
        assert done - start == pytest.approx(float(r["kv_transfer_s"]))
    # A prefill replica's part ends at its last hand-off; each replica's busy share is one.
    prefill = metrics["replicas"][0]
    assert prefill["makespan_s"] == pytest.approx(max(float(r["first_token_s"]) for r in rows))
    assert metrics["makespan_s"] == max(r["makespan_s"] for r in metrics["replicas"])
    for r in metrics["replicas"]:
        assert 0 < r["utilisation"] <= 1
        assert r["utilisation"] == pytest.approx(r["busy_s"] / metrics["makespan_s"])
    # The transfers each replica sends (replica 0: all 8) or receives, drawn on its timeline.
    moving = transfers_in_flight(rows)
    assert sorted(moving) == [0, 1, 2]
    for _, counts in moving.values():
        assert counts.min() >= 0 and counts[-1] == 0 and counts.max() >= 1
    # The picture: per replica, its rows and blocks at each of its steps, and its transfers.
    wanted = ("time", "rows", "blocks_in_use", "replica")
    columns = read_step_columns(tmp_path / "steps.csv", wanted)
    figures: list[Any] = []

    def keep(fig: Any, path: Path) -> Path:
        figures.append(fig)
        return save_figure(fig, path)

    monkeypatch.setattr(replica_plots, "save_figure", keep)
    drawn = plot_replica_load(columns, tmp_path / "replica_load.png", rows)
    (fig,) = figures
    assert png_size(drawn) == (900, 750)  # three panels of 9 x 2.5 inches at 100 dpi
    rows_ax, blocks_ax, kv_ax = fig.axes
    for replica in (0, 1, 2):
        mine = columns["replica"] == replica
        assert mine.any()
        for ax, column in ((rows_ax, "rows"), (blocks_ax, "blocks_in_use")):
            (line,) = [ln for ln in ax.get_lines() if ln.get_label() == f"replica {replica}"]
            assert line.get_xdata().tolist() == columns["time"][mine].tolist()
            assert line.get_ydata().tolist() == columns[column][mine].tolist()
    curves = [(ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in kv_ax.get_lines()]
    assert curves == [(t.tolist(), counts.tolist()) for t, counts in moving.values()]
    starts = [sum(b > a for a, b in zip([0, *y], y, strict=False)) for _, y in curves]
    assert starts == [8, 4, 4]  # replica 0 sends every transfer, each decode replica gets 4


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["cluster.roles=[prefill,decode]"], "cluster.roles has 2 roles for cluster.replicas = 1"),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,prefil]"],
            "cluster.roles: unknown role 'prefil'; each is prefill, decode or mixed",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,prefill]"],
            "cluster.roles leave no replica to decode requests (decode or mixed)",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[decode,decode]"],
            "cluster.roles leave no replica to prefill requests (prefill or mixed)",
        ),
        (
            ["cluster.replicas=2", "cluster.prefill=2", "cluster.decode=1"],
            "cluster.prefill + cluster.decode = 3 exceeds cluster.replicas = 2",
        ),
        (
            ["cluster.replicas=2", "cluster.prefill=1", "cluster.roles=[prefill,decode]"],
            "set cluster.roles or the counts cluster.prefill and cluster.decode, not both",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link=wifi"],
            "cluster.link must be one of nvlink, nvlink3, nvlink_bridge, infiniband, pcie, "
            "ethernet; got 'wifi'",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link_gbps=0"],
            "cluster.link_gbps must be > 0 (Gbit/s each way); got 0",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link_gbps=-5"],
            "cluster.link_gbps must be > 0",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,decode]", "cluster.link_latency_us=-1"],
            "cluster.link_latency_us must be >= 0; got -1",
        ),
        (
            ["cluster.replicas=2", "cluster.layerwise=true"],
            "cluster.layerwise applies to a cluster with prefill replicas (cluster.roles)",
        ),
        (
            ["cluster.replicas=2", "cluster.roles=[prefill,decode]", "router.decode=nearest"],
            "router.decode=nearest: no router policy of that name; router offers",
        ),
        (
            ["executor=model", "cluster.replicas=2", "cluster.roles=[prefill,decode]"],
            "cluster.roles (prefill/decode disaggregation) runs on executor=simulated",
        ),
    ],
)
def test_bad_disaggregation_input_is_one_line(
    capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    base = [a for a in SIM if not (a.startswith("executor=") and "executor=model" in overrides)]
    base = [a for a in base if not (a.startswith("executor.") and "executor=model" in overrides)]
    status, _, err = cli(capsys, *base, *overrides)
    assert_refused(status, err, expected)


def test_only_replicas_with_roles_keep_hand_off_books(shape: tuple[Any, Any]) -> None:
    """One engine, and a cluster without roles, park nothing; a cluster with roles gives
    every replica its books. An engine's parked requests have one keeper, and a row handed
    off by an engine that parks nothing is an invariant error, not a silent no-op."""
    from framework.cluster.replica_handoffs import ReplicaHandOffs
    from framework.engine.invariants import InvariantError

    plain = runner(shape, "cluster.replicas=2")
    assert all(e.parking is None and not e.joining for e in plain.engines)
    roles = runner(shape, "cluster.replicas=2", "cluster.roles=[prefill,decode]")
    assert all(isinstance(e.parking, ReplicaHandOffs) and not e.parking for e in roles.engines)
    with pytest.raises(InvariantError, match="one keeper"):
        ReplicaHandOffs(roles.engines[0])
    engine = plain.engines[0]
    engine.held.handed.append((engine.submit(spec(0, [1, 2, 3], 2), None)[0], 0.0))
    with pytest.raises(InvariantError, match="parks nothing"):
        engine.planner.hand_off()
