"""The simulated executor runs the very engine and policies: its counts equal a real run's.

Closed loop (every request waiting from the start), a simulated run that replays a real
run's tokens (`executor.replay`) must give that run's counts exactly, whatever the policies,
pool and window: steps, token slots, kept tokens, preemptions, recomputed tokens, overshoot,
transfers, and each request's tokens and finish reason. Without a replay, requests that
ignore EOS stop at `max_tokens` in both. The adaptive output policy is left out: it chooses
its window from measured seconds, which a simulation predicts instead.
"""

from __future__ import annotations

import csv
import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from hypothesis import given, note
from hypothesis import strategies as st

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.batch import Row
from framework.engine.clock import VirtualClock
from framework.engine.loop import RunResult
from framework.executors.sampler import draw_seed
from framework.executors.simulated.cost import FORMAT, HostCost, StepCost
from framework.executors.simulated.executor import SimulatedExecutor
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.tokens import ReplayError, TokenStreams, _hash
from framework.run.app import build_engine
from framework.run.report import decode_outputs
from framework.run.summary import COUNT_KEYS, summarize
from tests.helpers import assert_refused, cli, make_cfg

SCHEDULERS = ("static", "continuous", "priority", "sjf", "chunked", "lpm")
ALLOCATORS = ("worst_case", "incremental", "incremental", "prefix_cache")
PREEMPTIONS = ("newest", "oldest", "most_blocks")
# Counts that depend on nothing but the schedule: equal between the real and the simulated run.
SAME = [k for k in COUNT_KEYS if k != "window"] + ["requests_finished"]

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class LinearCost:
    """A stand-in cost model: seconds linear in the tokens and rows of a step."""

    kind: str = "test"
    meta: dict[str, Any] = field(default_factory=dict)
    host: HostCost = field(default_factory=lambda: HostCost(per_step_s=2e-4, per_row_s=1e-5))

    def predict(self, f: StepFeatures) -> StepCost:
        return StepCost(
            forward_s=1e-3 + 2e-5 * f.linear_tokens + 1e-8 * f.decode_ctx, sample_s=1e-4
        )


@functools.cache
def cfg_for(overrides: tuple[str, ...]) -> Any:
    return make_cfg("model=tiny", *overrides)


def real(tiny: Any, overrides: tuple[str, ...], specs: list[RequestSpec]) -> RunResult:
    model, tok = tiny
    engine = build_engine(cfg_for(overrides), model, torch.device("cpu"), torch.float32, Hooks())
    return engine.run(specs, tok.eos_token_id)


def simulated(
    tiny: Any,
    overrides: tuple[str, ...],
    specs: list[RequestSpec],
    replay: dict[str, list[int]] | None = None,
    host_model: bool = False,
    readback_s: float = 0.0,
    overlap: bool = False,
) -> RunResult:
    """The same engine over the tiny model's shape, its executor and clock swapped."""
    return simulated_engine(tiny, overrides, replay, host_model, readback_s, overlap).run(
        specs, tiny[1].eos_token_id
    )


def simulated_engine(
    tiny: Any,
    overrides: tuple[str, ...],
    replay: dict[str, list[int]] | None = None,
    host_model: bool = False,
    readback_s: float = 0.0,
    overlap: bool = False,
) -> Any:
    model, tok = tiny
    cost = LinearCost()
    host = cost.host.seconds if host_model else None
    clock = VirtualClock(host_s=host, overlap=overlap)
    cfg = cfg_for(overrides)
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, Hooks(), clock=clock)
    tokens = TokenStreams(model.config.vocab_size, tok.eos_token_id, replay)
    engine.executor = SimulatedExecutor(cost, tokens, readback_s=readback_s, overlap=overlap)
    return engine


class Hooks:
    def on_step_end(self, stats: Any) -> None:
        pass

    def on_request_finished(self, request: Any) -> None:
        pass


def spec(i: int, prompt: list[int], max_tokens: int, ignore_eos: bool, stop=(), arrival=0.0):  # type: ignore[no-untyped-def]
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop)
    return RequestSpec(f"r{i}", prompt, sp, arrival=arrival)


@st.composite
def cases(
    draw: st.DrawFn, vocab: int
) -> tuple[list[tuple[list[int], int, bool, bool]], tuple[str, ...]]:
    n = draw(st.integers(1, 8))
    reqs = [
        (
            draw(st.lists(st.integers(3, vocab - 1), min_size=1, max_size=30)),
            draw(st.integers(1, 20)),
            draw(st.booleans()),  # ignore_eos
            draw(st.booleans()),  # a stop token from the model's own continuation
        )
        for _ in range(n)
    ]
    bs = draw(st.sampled_from([1, 4, 16]))
    need = max(-(-(len(p) + m) // bs) for p, m, _, _ in reqs)
    window = draw(st.sampled_from([0, 0, 1, 4, 8]))
    scheduler = draw(st.sampled_from(SCHEDULERS))
    chunk = ()
    if scheduler == "chunked":  # a budget below the longest request: served in chunks
        size = draw(st.sampled_from(["1", "7", "16", "null"]))
        chunk = (f"scheduler.chunk_size={size}", f"engine.max_num_batched_tokens={8 + 2 * bs}")
    over = (
        f"scheduler={scheduler}",
        *chunk,
        f"allocator={draw(st.sampled_from(ALLOCATORS))}",
        f"preemption.victim={draw(st.sampled_from(PREEMPTIONS))}",
        *(("output=deferred", f"window={window}") if window else ("output=immediate",)),
        f"engine.block_size={bs}",
        f"engine.num_blocks={need + draw(st.sampled_from([0, 0, 1, 3 * need]))}",
        f"engine.max_num_seqs={draw(st.integers(1, 8))}",
    )
    return reqs, over


@given(data=st.data())
def test_a_replayed_simulation_has_the_real_runs_counts(tiny: Any, data: Any) -> None:
    model, _ = tiny
    reqs, over = data.draw(cases(model.config.vocab_size), label="case")
    note(f"python run.py model=tiny {' '.join(over)}")
    # Stop tokens that really fire: taken from each request's own greedy continuation.
    base = real(tiny, over, [spec(i, p, m, True) for i, (p, m, _, _) in enumerate(reqs)])
    outs = {s.id: s.output_token_ids for s in base.seqs}
    specs = [
        spec(i, p, m, ig, stop=(outs[f"r{i}"][-1],) if want and outs[f"r{i}"] else ())
        for i, (p, m, ig, want) in enumerate(reqs)
    ]
    ref = real(tiny, over, specs)
    sim = simulated(tiny, over, specs, replay={s.id: s.output_token_ids for s in ref.seqs})
    a, b = summarize(ref), summarize(sim)
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    for r, s in zip(ref.seqs, sim.seqs, strict=True):
        assert (r.id, r.output_token_ids, r.finish_reason) == (
            s.id,
            s.output_token_ids,
            s.finish_reason,
        )
    assert b["clock"] == "virtual" and b["executor"] == "simulated" and b["cost_model"] == "test"


def test_without_a_replay_requests_that_ignore_eos_stop_at_max_tokens(tiny: Any) -> None:
    specs = [spec(i, [5 + i] * (3 + 2 * i), 4 + 3 * i, True) for i in range(6)]
    over = ("scheduler=static", "allocator=worst_case", "engine.max_num_seqs=4")
    a, b = summarize(real(tiny, over, specs)), summarize(simulated(tiny, over, specs))
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    assert b["waste_fraction"] > 0  # the static batch's waste is simulated too


def test_drawn_lengths_end_on_the_stop_token_within_max_tokens(tiny: Any) -> None:
    _, tok = tiny
    specs = [spec(i, [7] * 5, 40, False) for i in range(20)]
    res = simulated(tiny, ("engine.max_num_seqs=8",), specs)
    lengths = [len(s.output_token_ids) for s in res.seqs]
    assert all(1 <= n <= 40 for n in lengths) and len(set(lengths)) > 1  # drawn, not all equal
    for s in res.seqs:
        assert s.finish_reason == "length" or s.output_token_ids[-1] == tok.eos_token_id
        assert tok.eos_token_id not in s.output_token_ids[:-1]
    again = simulated(tiny, ("engine.max_num_seqs=3",), specs)
    assert [s.output_token_ids for s in again.seqs] == [s.output_token_ids for s in res.seqs]


def test_the_virtual_clock_jumps_to_arrivals_and_never_goes_back(tiny: Any) -> None:
    specs = [spec(i, [9] * 4, 6, True, arrival=1000.0 * i) for i in range(3)]
    t0 = time.perf_counter()
    res = simulated(tiny, (), specs)
    assert time.perf_counter() - t0 < 60  # 2000 simulated seconds of waiting, not slept
    times = [st_.time for st_ in res.steps]
    assert times == sorted(times)
    for s in res.seqs:
        assert s.arrival <= s.admitted_at <= s.first_token_at <= s.finished_at
        assert s.token_times == sorted(s.token_times)
    assert summarize(res)["makespan_s"] > 2000


def test_with_model_host_time_two_runs_give_identical_metrics(tiny: Any) -> None:
    specs = [spec(i, [3 + i] * (2 + i), 5 + i, True, arrival=0.01 * i) for i in range(8)]
    over = ("engine.max_num_seqs=3", "output=deferred", "window=2")
    one, two = (summarize(simulated(tiny, over, specs, host_model=True)) for _ in range(2))
    times = [k for k in one if k.endswith("_s") or k.startswith("time_share")]
    assert times and {k: one[k] for k in times} == {k: two[k] for k in times}
    # and, all arriving at once (no wait to jump over), the clock reads the sum of what the
    # model says each step cost: host work plus the executor's prediction
    at_once = [RequestSpec(s.id, s.prompt_token_ids, s.sampling) for s in specs]
    res = simulated(tiny, over, at_once, host_model=True)
    assert res.steps[-1].time == pytest.approx(
        sum(sum(st_.phase_s.values()) for st_ in res.steps), rel=1e-12
    )
    assert all(st_.phase_s["schedule"] == 0 and st_.phase_s["host"] > 0 for st_ in res.steps)


@pytest.mark.parametrize("output", [(), ("output=deferred", "window=3")])
def test_a_simulated_readback_costs_the_profiles_seconds(tiny: Any, output: tuple) -> None:
    """The profile's `readback_s` is charged on the virtual clock at every transfer and
    shows as the steps' `readback` phase; the counts do not depend on it."""
    at_once = [spec(i, [3 + i] * (2 + i), 5 + i, True) for i in range(8)]
    over = ("engine.max_num_seqs=3", *output)
    free = simulated(tiny, over, at_once, host_model=True)
    priced = simulated(tiny, over, at_once, host_model=True, readback_s=0.25)
    a, b = summarize(free), summarize(priced)
    assert {k: a[k] for k in COUNT_KEYS} == {k: b[k] for k in COUNT_KEYS}
    transfers = sum(st_.transfers for st_ in priced.steps)
    assert transfers > 0
    readback = sum(st_.phase_s.get("readback", 0.0) for st_ in priced.steps)
    assert readback == pytest.approx(0.25 * transfers, rel=1e-12)
    assert priced.steps[-1].time == pytest.approx(
        sum(sum(st_.phase_s.values()) for st_ in priced.steps), rel=1e-12
    )
    assert priced.steps[-1].time - free.steps[-1].time == pytest.approx(readback, rel=1e-9)


TIMES = ("makespan_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "e2e_p99_s")


def test_with_immediate_output_a_device_beside_the_host_changes_nothing(tiny: Any) -> None:
    """Every step drains at once, so the host waits for each step's device work before it
    goes on: the same times as a clock on which host and forward take turns."""
    at_once = [spec(i, [3 + i] * (2 + i), 5 + i, True) for i in range(8)]
    over = ("engine.max_num_seqs=3", "output=immediate")
    turns, beside = (
        summarize(simulated(tiny, over, at_once, host_model=True, readback_s=1e-4, overlap=o))
        for o in (False, True)
    )
    assert {k: turns[k] for k in SAME} == {k: beside[k] for k in SAME}
    assert {k: beside[k] for k in TIMES} == pytest.approx({k: turns[k] for k in TIMES}, rel=1e-9)
    assert beside["overlap"] == "host and device" and turns["overlap"] == "none"


@pytest.mark.parametrize("window", [1, 3])
def test_deferred_output_hides_host_work_behind_a_device_beside_the_host(
    tiny: Any, window: int
) -> None:
    """Held steps let the engine's host work (and the copies home, on their own stream) run
    while the device computes: the run ends sooner, by no more than the host work and copies
    there were to hide. The host's own timeline (its phases, its waits, its copies) is the
    clock; the device's seconds run beside it."""
    at_once = [spec(i, [3 + i] * (2 + i), 9 + i, True) for i in range(8)]
    over = ("engine.max_num_seqs=3", "output=deferred", f"window={window}")
    turns, beside = (
        simulated(tiny, over, at_once, host_model=True, readback_s=1e-4, overlap=o)
        for o in (False, True)
    )
    a, b = summarize(turns), summarize(beside)
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    hideable = sum(st_.phase_s["host"] + st_.phase_s.get("readback", 0) for st_ in turns.steps)
    assert a["makespan_s"] - hideable <= b["makespan_s"] < a["makespan_s"]
    device = ("forward", "sample")
    assert beside.steps[-1].time == pytest.approx(
        sum(v for st_ in beside.steps for k, v in st_.phase_s.items() if k not in device),
        rel=1e-12,
    )
    assert sum(st_.phase_s.get("wait", 0.0) for st_ in beside.steps) > 0
    assert all(st_.phase_s.get("wait", 0.0) == 0.0 for st_ in turns.steps)
    times = [st_.time for st_ in beside.steps]
    assert times == sorted(times)
    for s in beside.seqs:
        assert s.arrival <= s.admitted_at <= s.first_token_at <= s.finished_at
        assert s.token_times == sorted(s.token_times)


def test_the_device_runs_one_step_at_a_time_and_tokens_wait_for_it() -> None:
    """The clock alone: a step's device work starts after the one before it ends and after
    its inputs are prepared; a drain returns no sooner than its newest step's copy."""
    clock = VirtualClock(host_s=lambda rows: 0.5, overlap=True)
    clock.start()
    clock.executing(1)
    ready1, waited1 = clock.executed(0.25, 2.0)  # host 0.5 + prepare 0.25, then 2 s of device
    assert (ready1, waited1) == (2.75, 0.0) and clock.now() == 0.75
    clock.executing(1)  # 0.5 s of host work hides behind the device
    ready2, waited2 = clock.executed(0.25, 2.0)  # the copies wait until 2.75
    assert waited2 == pytest.approx(1.5) and ready2 == pytest.approx(5.0)
    waited, copy = clock.fetched(ready2, 0.1)
    assert (waited, copy) == (pytest.approx(2.0), pytest.approx(0.1))
    assert clock.now() == pytest.approx(5.1)
    assert clock.fetched(ready1, 0.1) == (0.0, 0.0)  # long home already


def test_the_adaptive_window_reads_the_predicted_readback(tiny: Any) -> None:
    """Under the simulator the output policies' transfer cost is the profile's readback (at
    the run's speed), not the wall time of joining host lists."""
    at_once = [spec(i, [3 + i] * (2 + i), 12, True) for i in range(6)]
    engine = simulated_engine(tiny, ("output=adaptive",), host_model=True, readback_s=0.02)
    engine.run(at_once, tiny[1].eos_token_id)
    assert engine.costs.transfer_s == 0.02


@given(
    seed=st.integers(0, 2**63 - 1),
    indices=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=5),
    rid=st.text(min_size=1, max_size=8),
)
def test_a_rows_token_is_its_seeded_draw_in_every_path(
    seed: int, indices: list[int], rid: str
) -> None:
    """A request with no stop token to draw: its token at index i is draw_seed(salt, i)
    mod the vocabulary, whether it is the request's first row (`token`) or a later one (the
    batch loop's precomputed form)."""
    vocab = 49152
    streams = TokenStreams(vocab, eos_token_id=2)
    sp = SamplingParams(seed=seed, max_tokens=1 << 21, ignore_eos=True)
    rows = [Row(rid, [1], 5, [], [0], 6, sp, i) for i in indices]
    salt = seed ^ _hash(rid)
    want = [draw_seed(salt, i) % vocab for i in indices]
    assert streams.tokens(rows) == want  # the first row takes `token`, the rest the loop's
    assert streams.tokens(rows) == want  # every row the loop's


def test_a_replay_must_cover_the_workload() -> None:
    streams = TokenStreams(100, 2, replay={"r0": [5, 2]})
    streams.check_covers(["r0"])
    with pytest.raises(ReplayError, match=r"lacks 1 request\(s\) of the workload, the first 'r1'"):
        streams.check_covers(["r0", "r1"])


# ---- the command line ------------------------------------------------------------------------

MODELS = Path(__file__).resolve().parents[1] / "framework/executors/simulated/models"
H100 = "llama-8b-bfloat16-h100-sxm.analytic"  # a shipped profile, by name


def test_a_simulated_run_from_the_command_line_says_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model=tiny priced as if it were the 8B on an H100 (a profile for another model, so
    said explicitly): every file written, the times on the virtual clock, labelled analytic."""
    args = ("model=tiny", "workload=straggler", "observers=[console]", "executor=simulated")
    status, _, err = cli(
        capsys, *args, f"executor.profile={H100}", "executor.any_profile=true",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["executor"], m["clock"], m["cost_model"]) == ("simulated", "virtual", "analytic")
    assert m["profile"].endswith(f"{H100}.yaml") and m["token_slots"] == 60
    assert m["overlap"] == "host and device"  # a GPU's profile: the device runs beside the host
    assert (tmp_path / "steps.csv").exists() and (tmp_path / "outputs.jsonl").exists()


NOWHERE = {"cpu": "A CPU no profile was measured on", "family": 0, "model_number": 0,
           "microarchitecture": None, "cores": 2, "isa": {}}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("model=tiny", ("executor.tensor_parallel=2",)),
        pytest.param("model=smollm2", ("dtype=bfloat16",), marks=pytest.mark.slow),
    ],
)
def test_with_no_profile_a_run_prices_its_own_model_on_an_analytic_gpu(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    extra: tuple[str, ...],
) -> None:
    """On a CPU with no measured profile, any model simulates: the analytic profile of its
    own config on executor.hardware, said in one line and in metrics.json."""
    import framework.run.simulation as simulation

    monkeypatch.setattr(simulation, "cpu_info", lambda: NOWHERE)
    args = (model, "workload=straggler", "observers=[console]", "executor=simulated", *extra)
    status, _, err = cli(capsys, *args, f"hydra.run.dir={tmp_path}")
    assert status == 0, err[-3000:]
    assert "using the analytic profile of this model on NVIDIA H100 SXM5 80GB" in err
    assert "an estimate for that GPU" in err
    m = json.loads((tmp_path / "metrics.json").read_text())
    tp = "2" if "executor.tensor_parallel=2" in extra else "1"
    assert (m["cost_model"], m["hardware"], m["tensor_parallel"]) == ("analytic", "h100-sxm", tp)
    assert m["profile"] == "analytic:h100-sxm" + ("-tp2" if tp == "2" else "")
    assert m["overlap"] == "host and device" and m["token_slots"] > 0


def test_a_mixture_of_experts_config_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import framework.run.simulation as simulation

    monkeypatch.setattr(simulation, "cpu_info", lambda: NOWHERE)
    config = json.loads((MODELS / "llama-8b" / "config.json").read_text())
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                  num_local_experts=8, num_experts_per_tok=2)  # fmt: skip
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps(config))
    status, _, err = cli(
        capsys, "executor=simulated", "model=hf", f"model.path={tmp_path}/moe",
        "dtype=bfloat16", "workload=straggler", "observers=[console]",
        f"hydra.run.dir={tmp_path}/out",
    )  # fmt: skip
    assert_refused(status, err, "model_config.num_local_experts: a mixture-of-experts model")


def test_tensor_parallel_holds_one_gpus_share_of_the_kv_heads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pool is one GPU's: at TP 2 the tiny model's 2 KV heads are one a GPU, so the same
    engine.kv_memory_mb holds twice the blocks; and a TP run's steps cost less."""
    blocks, makespan = {}, {}
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}"
        status, _, err = cli(
            capsys, "model=tiny", "workload=straggler", "observers=[console]",
            "executor=simulated", "executor.hardware=h100-sxm", f"executor.tensor_parallel={tp}",
            "engine.kv_memory_mb=1", f"hydra.run.dir={out}",
        )  # fmt: skip
        assert status == 0, err[-3000:]
        m = json.loads((out / "metrics.json").read_text())
        blocks[tp], makespan[tp] = m["num_blocks"], m["makespan_s"]
    assert blocks[2] == 2 * blocks[1]
    assert makespan[2] != makespan[1]


def test_speed_divides_every_predicted_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`executor.speed=0.5`: a machine half as fast. With the host time modelled and every
    request waiting from the start, the whole run takes exactly twice as long; the schedule
    (every count) is the same, and metrics.json says what speed was assumed.
    `executor.compute_speed=0.5` alone slows only the compute-bound seconds (the profile's
    per-token terms): the run lands strictly between the two, and equal to `speed=0.5`
    when both are set."""
    profile = tmp_path / "p.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "format": FORMAT,
                "kind": "measured",
                "meta": {"model": "x"},
                "forward": {
                    "intercept_s": 0.01,
                    "per": {"linear_tokens": 1e-4, "decode_ctx": 1e-6},
                },
                "sample": {"intercept_s": 1e-5, "per": {"rows": 1e-6}},
                "host": {"per_step_s": 1e-4, "per_row_s": 1e-5},
            }
        )
    )
    runs = {
        "one": (),
        "half": ("executor.speed=0.5",),
        "compute": ("executor.compute_speed=0.5",),
        "both": ("executor.speed=0.5", "executor.compute_speed=0.5"),
    }
    got = {}
    for name, speeds in runs.items():
        status, _, err = cli(
            capsys, "model=tiny", "workload=straggler", "observers=[console]",
            "executor=simulated", f"executor.profile={profile}", "executor.any_profile=true",
            "executor.host_time=model", *speeds, f"hydra.run.dir={tmp_path}/{name}",
        )  # fmt: skip
        assert status == 0, err[-3000:]
        got[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    one, half = got["one"], got["half"]
    assert one["overlap"] == "none"  # measured on no GPU: host and forward take turns
    assert "speed" not in one and half["speed"] == "0.5"
    assert got["compute"]["compute_speed"] == "0.5" and "compute_speed" not in got["both"]
    assert half["makespan_s"] == pytest.approx(2 * one["makespan_s"], rel=1e-9)
    assert got["both"]["makespan_s"] == pytest.approx(half["makespan_s"], rel=1e-9)
    assert one["makespan_s"] < got["compute"]["makespan_s"] < half["makespan_s"]
    for other in got.values():
        assert {k: other[k] for k in SAME} == {k: one[k] for k in SAME}


def test_measured_host_time_adds_the_real_executors_preparation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulated step builds no tensors (ids, positions, slot mapping, block tables), so
    under `executor.host_time=measured` the profile's `prepare` (the real executor's tensor
    preparation) is added to each step, in its build phase, divided by the speed like every
    predicted second. Under `model` the modelled host cost covers it: nothing is added."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "kind": "measured",
        "meta": {"model": "x"},
        "forward": {"intercept_s": 0.01, "per": {"linear_tokens": 1e-4}},
        "sample": {"intercept_s": 1e-5, "per": {}},
        "host": {"per_step_s": 1e-4, "per_row_s": 1e-5},
    }
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(data))
    prepared = tmp_path / "prepared.yaml"
    prepared.write_text(yaml.safe_dump({**data, "prepare": {"intercept_s": 0.25, "per": {}}}))
    runs = {
        "measured": (prepared, "measured", ()),
        "slower": (prepared, "measured", ("executor.speed=0.5",)),
        "model": (prepared, "model", ()),
        "model_plain": (plain, "model", ()),
    }
    got: dict[str, tuple[dict[str, Any], list[dict[str, str]]]] = {}
    for name, (profile, host, extra) in runs.items():
        status, _, err = cli(
            capsys, "model=tiny", "workload=straggler", "observers=[console]",
            "executor=simulated", f"executor.profile={profile}", "executor.any_profile=true",
            f"executor.host_time={host}", *extra, f"hydra.run.dir={tmp_path}/{name}",
        )  # fmt: skip
        assert status == 0, err[-3000:]
        with (tmp_path / name / "steps.csv").open() as f:
            steps = list(csv.DictReader(f))
        got[name] = (json.loads((tmp_path / name / "metrics.json").read_text()), steps)
    metrics, steps = got["measured"]
    assert steps and all(0.25 <= float(s["build_s"]) < 0.5 for s in steps)
    assert metrics["makespan_s"] >= 0.25 * metrics["steps"]
    assert all(0.5 <= float(s["build_s"]) < 0.75 for s in got["slower"][1])
    assert got["model"][0]["makespan_s"] == got["model_plain"][0]["makespan_s"]
    for other, _ in got.values():
        assert {k: other[k] for k in SAME} == {k: metrics[k] for k in SAME}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("executor.profile={tmp}/none.yaml",), "executor.profile={tmp}/none.yaml: no such file"),
        (("executor.profile={tmp}/bad.yaml",), "executor.profile={tmp}/bad.yaml: not a nanoserve"),
        (
            (f"executor.profile={H100}",),
            "is for LlamaForCausalLM-L32-H4096-A32-KV8-V128256 in bfloat16, this run is "
            "LlamaForCausalLM-L2-H64-A4-KV2-V49152 in float32; set executor.any_profile=true",
        ),
        (
            (f"executor.profile={H100}", "executor.any_profile=true", "executor.replay={tmp}/r"),
            "executor.replay lacks 7 request(s) of the workload, the first 'r1'",
        ),
        (
            (
                f"executor.profile={H100}",
                "executor.any_profile=true",
                "executor.replay={tmp}/bad.yaml",
            ),
            "executor.replay={tmp}/bad.yaml, line 1: not a line of outputs.jsonl (needs id",
        ),
        (("executor.host_time=guess",), "executor.host_time must be measured or model"),
        (("executor.speed=0",), "executor.speed must be > 0 (1: the profile's machine); got 0"),
        (("executor.compute_speed=-1",), "executor.compute_speed must be > 0, or null for"),
        (("executor=model", "executor.replay=x"), "executor.replay applies to executor=simulated"),
        (("executor.overlap=maybe",), "executor.overlap must be auto (a GPU profile: true, a"),
        (("executor=model", "executor.overlap=true"), "executor.overlap applies to executor=sim"),
        (("executor.tensor_parallel=3",), "executor.tensor_parallel must be 1, 2, 4 or 8; got 3"),
        (("executor=model", "executor.tensor_parallel=2"), "executor.tensor_parallel applies to"),
        (("executor.hardware=tpu9",), "hardware spec tpu9: not shipped (shipped: a100-40gb, a1"),
        (("executor.tensor_parallel=8",), "tensor_parallel=8 must divide the model's 4 attention"),
        (
            ("executor.tensor_parallel=4", "executor.hardware=a100-80gb-pcie"),
            "executor.tensor_parallel=4: a100-80gb-pcie over nvlink_pair accepts 1, 2",
        ),
        (
            (
                "executor.tensor_parallel=2",
                "executor.hardware=a100-80gb-pcie",
                "executor.interconnect=dgx",
            ),
            "executor.interconnect=dgx: a100-80gb-pcie has all-reduce fits for nvlink_pair",
        ),
    ],
)
def test_bad_simulator_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: tuple[str, ...], expected: str
) -> None:
    (tmp_path / "bad.yaml").write_text("just: text\n")
    (tmp_path / "r").write_text('{"id": "r0", "output_token_ids": [5, 6, 7, 8]}\n')
    args = [o.format(tmp=tmp_path) for o in overrides]
    status, _, err = cli(
        capsys, "model=tiny", "workload=straggler", "observers=[console]", "executor=simulated",
        *args, f"hydra.run.dir={tmp_path}/out",
    )  # fmt: skip
    assert_refused(status, err, expected.format(tmp=tmp_path))


ZEN3 = {"cpu": "AMD EPYC", "family": 25, "model_number": 1, "microarchitecture": "zen3"}
ZEN4 = {"cpu": "AMD EPYC", "family": 25, "model_number": 17, "microarchitecture": "zen4"}
XEON = {"cpu": "Intel Xeon", "family": 6, "model_number": 143, "microarchitecture": None}


@pytest.mark.parametrize(
    ("here", "shipped", "chosen"),
    [
        (ZEN3, ("zen3", "zen4"), "zen3"),  # one name, "AMD EPYC": the numbers decide
        (ZEN4, ("zen3", "zen4"), "zen4"),
        ({**ZEN4, "model_number": 97}, ("zen3", "zen4"), "zen4"),  # another Zen 4 model
        (XEON, ("zen4",), None),  # measured elsewhere only: the analytic profile instead
        (XEON, ("zen3", "zen4"), None),
    ],
)
def test_the_shipped_profile_is_the_one_measured_on_this_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: dict, shipped: tuple, chosen: str | None
) -> None:
    import framework.run.simulation as simulation
    from framework.executors.simulated.cost import model_id

    config = SimpleNamespace(
        architectures=["LlamaForCausalLM"], num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, hidden_size=64, vocab_size=100,
    )  # fmt: skip
    machines = {"zen3": ZEN3, "zen4": ZEN4}
    files = [(f"m-float32-{name}", model_id(config), machines[name]) for name in shipped]
    files.append(("other-float32-here", "x", here))  # another model's, from here: never chosen
    for stem, model, machine in files:
        meta = {"model_id": model, "dtype": "float32", "machine": machine}
        text = yaml.safe_dump({"format": FORMAT, "kind": "measured", "meta": meta})
        (tmp_path / f"{stem}.yaml").write_text(text)
    monkeypatch.setattr(simulation, "PROFILES", tmp_path)
    monkeypatch.setattr(simulation, "cpu_info", lambda: {"cores": 2, "isa": {}, **here})
    cfg = make_cfg("model=tiny", "executor=simulated")
    shape = simulation.ModelShape(config, None)
    if chosen is None:
        assert simulation.choose_profile(cfg, shape) is None  # analytic_for takes over
    else:
        assert Path(simulation.choose_profile(cfg, shape)).name == f"m-float32-{chosen}.yaml"


def test_the_scale_experiment_runs_a_trace_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments.sim.sim_scale import main
    from framework.run.paths import TRACES

    if not TRACES["conv"].is_file():
        pytest.skip("the Azure traces live in ../shared, absent here")
    main(["--limit", "40", "--traces", "conv", "--rounds", "2", "--out", str(tmp_path),
          "model=tiny", f"executor.profile={H100}", "executor.any_profile=true"])  # fmt: skip
    text = (tmp_path / "sim_scale.md").read_text()
    assert "| conv | off | 40 |" in text and "| conv | on | 40 |" in text
    assert "- conv: the invariant checks add " in text and "(median of 2 rounds; " in text
    with (tmp_path / "sim_scale.csv").open() as f:
        runs = list(csv.DictReader(f))
    # Two rounds, the order alternating; every round counts the same steps.
    order = re.findall(r"conv invariants (o[nf]+), round (\d)/2", capsys.readouterr().out)
    assert order == [("off", "1"), ("on", "1"), ("on", "2"), ("off", "2")]
    assert [(r["round"], r["invariants"]) for r in runs] == [
        ("1", "off"), ("2", "off"), ("1", "on"), ("2", "on")
    ]  # fmt: skip
    assert len({r["steps"] for r in runs}) == 1 and float(runs[0]["steps_per_s"]) > 0
    with (tmp_path / "sim_scale_summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert [(r["invariants"], r["rounds"]) for r in summary] == [("off", "2"), ("on", "2")]


def test_sweeps_studies_plots_and_mlflow_work_under_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study is a sweep of policies: under the simulator it runs, compares the runs'
    tokens, writes its table; each job draws its plots and is an MLflow run tagged with
    what predicted its seconds."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    status, _, err = cli(
        capsys, "-m", "+experiment=batching", "model=tiny", "executor=simulated",
        f"executor.profile={H100}", "executor.any_profile=true", f"mlflow.tracking_uri={uri}",
        "observers=[console,plots,mlflow]", f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    assert (tmp_path / "sweep" / "batching.md").exists()
    assert (tmp_path / "sweep" / "0" / "slot_timeline.png").exists()
    runs = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()]
    )
    jobs = [r for r in runs if r.data.tags.get("nanoserve.kind") == "job"]
    assert len(jobs) == 4
    for r in jobs:
        assert r.data.tags["nanoserve.executor"] == "simulated"
        assert r.data.tags["nanoserve.cost_model"] == "analytic"
        assert r.data.tags["nanoserve.hardware"] == "h100-sxm"
        assert r.data.tags["nanoserve.tensor_parallel"] == "1"
        assert r.data.tags["nanoserve.clock"] == "virtual"
        assert r.data.tags["nanoserve.overlap"] == "host and device"


@given(st.lists(st.lists(st.integers(0, 49151), max_size=40), min_size=1, max_size=12))
def test_answers_decoded_in_one_batch_read_as_decoded_one_by_one(
    tiny: tuple[Any, Any], outputs: list[list[int]]
) -> None:
    """`decode_outputs` hands a fast tokenizer's backend every answer at once: the texts are
    those of its `decode`, one answer at a time (special tokens and byte pieces included)."""
    tok = tiny[1]
    outputs[0] = [*outputs[0], tok.eos_token_id]
    result = SimpleNamespace(
        seqs=[SimpleNamespace(id=f"r{i}", output_token_ids=o) for i, o in enumerate(outputs)]
    )
    one_by_one = {f"r{i}": tok.decode(o, skip_special_tokens=True) for i, o in enumerate(outputs)}
    assert decode_outputs(tok, result) == one_by_one

    class Plain:  # no backend: the one-by-one path
        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    assert decode_outputs(Plain(), result) == one_by_one
