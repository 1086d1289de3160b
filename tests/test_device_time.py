"""Device time (framework/executors/device_time.py): a step's forward and sampling seconds
from events on the device's stream, read only once they are done and never waited for inside
a step. With a fake stream whose events complete only when the test says (a drain's copy
waited for, or the end of a run), on the tiny model: the engine puts each step's device
seconds where the run reports forward and sampling, and the host's launch seconds in `host`,
under immediate output and deferred windows 1 and 4; a CPU run is unchanged; the calibration
recorder reads the spans after its run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.sim import check_cases, check_gpu, sim_check
from experiments.toolkit.config import REFERENCE
from framework.calibration import fitting
from framework.calibration.grid import quick_grid
from framework.calibration.point_run import PointRun, Recorder, host_seconds
from framework.core.request import SamplingParams
from framework.core.step_stats import StepStats
from framework.engine.batch import Row, StepBatch
from framework.engine.held import DEVICE_TIMED, device_phases
from framework.engine.step_log import StepLog
from framework.executors.device_time import DeviceSpan
from framework.executors.simulated.cost import model_id
from framework.executors.simulated.load import load_cost_model
from framework.executors.simulated.profile import LinearCost, MeasuredProfile
from framework.run.app import build_engine
from framework.run.in_process import NullHooks
from framework.run.summary import summarize
from tests.helpers import make_cfg, spec

pytestmark = pytest.mark.usefixtures("one_thread")


class FakeStream:
    """A device queue: events are stamped in the order recorded, at the times the test
    gives, and are done only up to `done_through` (moved by the test, or by a wait)."""

    def __init__(self) -> None:
        self.recorded = 0
        self.done_through = -1
        self.waits = 0  # synchronize() calls: host waits
        self.stamps = itertools.count(0.0, 0.25)  # milliseconds, each event's default stamp
        self.next_ms: list[float] = []  # stamps to use first, in order

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.seq = -1
        self.ms = 0.0

    def record(self, stream: Any = None) -> None:
        s = self.stream
        self.seq, s.recorded = s.recorded, s.recorded + 1
        self.ms = s.next_ms.pop(0) if s.next_ms else next(s.stamps)

    def query(self) -> bool:
        return 0 <= self.seq <= self.stream.done_through

    def elapsed_time(self, end_event: FakeEvent) -> float:
        # CUDA refuses the elapsed time of an event not yet done; so does the fake
        assert self.query() and end_event.query(), "read before the device was done"
        return end_event.ms - self.ms

    def synchronize(self) -> None:
        self.stream.waits += 1
        self.stream.done_through = max(self.stream.done_through, self.seq)


def fake_span(stream: FakeStream, forward_ms: float, sample_ms: float) -> DeviceSpan:
    """A span of two parts whose device times are `forward_ms` and `sample_ms`."""
    start = 100.0 * (stream.recorded + 1)
    stream.next_ms += [start, start + forward_ms, start + forward_ms + sample_ms]
    span = DeviceSpan(stream.event)
    span.mark()
    span.mark()
    return span


# ---- the span ---------------------------------------------------------------------------
def test_a_span_is_read_only_once_done_and_never_waits_to_be() -> None:
    stream = FakeStream()
    span = fake_span(stream, 3.0, 0.5)
    assert span.parts() is None  # queued, not done: nothing read, nothing waited for
    stream.done_through = span.events[1].seq  # the forward done, the sampler not
    assert span.parts() is None
    assert stream.waits == 0
    stream.done_through = span.events[-1].seq
    assert span.parts() == pytest.approx((3.0e-3, 0.5e-3))
    assert stream.waits == 0
    other = fake_span(stream, 1.0, 0.25)
    assert other.wait() == pytest.approx((1.0e-3, 0.25e-3)) and stream.waits == 1


def test_no_span_on_a_cpu() -> None:
    assert DeviceSpan.begin(torch.device("cpu")) is None


def test_device_phases_move_the_launches_to_host() -> None:
    phases = {"build": 0.5, "forward": 0.25, "sample": 0.125, "output": 1.0}
    got = device_phases(phases, (2.0, 4.0))
    assert got == {"forward": 2.0, "sample": 4.0, "host": 0.375}
    assert device_phases({"forward": 0.25, "sample": 0.5, "host": 1.0}, (2.0,)) == {
        "forward": 2.0,
        "host": 1.25,  # a forward-only span: the sampler keeps the host's seconds
    }


def stats(k: int) -> StepStats:
    zeros = dict.fromkeys(("rows", "paused_rows", "prefill_rows", "prefill_tokens"), 0)
    zeros |= dict.fromkeys(("decode_rows", "decode_tokens", "partial_rows", "wasted_rows"), 0)
    zeros |= dict.fromkeys(("tokens_kept", "admitted", "evicted", "preempted", "waiting"), 0)
    zeros |= dict.fromkeys(("blocks_in_use", "transfers", "held_steps"), 0)
    return StepStats(step=k, time=float(k), window=0.0, phase_s={"forward": k / 8}, **zeros)


def test_a_logged_steps_phases_are_set_in_memory_in_the_file_and_on_the_newest() -> None:
    log = StepLog(chunk_rows=4)
    for k in range(10):  # rows 0-7 in the file, 8-9 in memory
        log.append(stats(k))
    for k in (1, 6, 8, 9):
        log.set_phases(k, {"forward": 10.0 + k, "host": 0.5})
    forward = log.column("forward_s")
    for k in range(10):
        want = 10.0 + k if k in (1, 6, 8, 9) else k / 8
        assert forward[k] == want and log[k].phase_s["forward"] == want
    assert log[-1].phase_s["host"] == 0.5 and log[6].phase_s["host"] == 0.5
    assert log.column("host_s")[0] == 0.0
    with pytest.raises(IndexError):
        log.set_phases(10, {"forward": 1.0})


# ---- the engine -------------------------------------------------------------------------
class Spanned:
    """The tiny model's executor, each step given a fake device span with its own seconds;
    a drain of the step's tokens completes its events (`complete_on_fetch`), as waiting for a
    copy queued after them on one stream does."""

    def __init__(self, inner: Any, stream: FakeStream) -> None:
        self.inner = inner
        self.stream = stream
        self.launch: list[tuple[float, float]] = []  # the host's seconds, each step
        self.device: list[tuple[float, float]] = []  # the span's, each step
        self.last_event: dict[int, int] = {}  # id(tokens) -> the step's last event
        self.waits_in_steps = 0
        self.decode_steps: list[tuple[int, float]] = []  # (rows, device forward seconds)
        self.observed: list[tuple[int, float]] = []  # what the output policies' costs got

    def describe(self) -> dict[str, str]:
        return self.inner.describe()

    def execute(self, batch: Any) -> Any:
        self.waits_in_steps += self.stream.waits
        result = self.inner.execute(batch)
        k = len(self.launch)
        forward_ms, sample_ms = 1.0 + 0.5 * k, 0.125 * (k + 1)
        result.span = fake_span(self.stream, forward_ms, sample_ms)
        rows = len(batch.rows)
        if batch.decode_rows == rows:  # as HFExecutor says it: a step of decode rows alone
            result.span.decode_rows = rows
            self.decode_steps.append((rows, forward_ms / 1e3))
        self.launch.append((result.forward_s, result.sample_s))
        self.device.append((forward_ms / 1e3, sample_ms / 1e3))
        self.last_event[id(result.tokens)] = result.span.events[-1].seq
        return result


def spanned_run(
    tiny: tuple[Any, Any], output: list[str], complete_on_fetch: bool
) -> tuple[Any, Spanned, FakeStream]:
    model, tok = tiny
    cfg = make_cfg("model=tiny", "engine.block_size=4", "engine.max_num_seqs=3", *output)
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, NullHooks())
    stream = FakeStream()
    ex = Spanned(engine.executor, stream)
    engine.executor = ex
    fetch = engine.readback.fetch

    def fetched(pending: list[Any]) -> list[int]:
        ex.waits_in_steps += stream.waits
        if complete_on_fetch:
            newest = max(ex.last_event[id(p.tokens)] for p in pending)
            stream.done_through = max(stream.done_through, newest)
        return fetch(pending)

    engine.readback.fetch = fetched
    observe = engine.costs.observe_forward

    def observed(rows: int, seconds: float) -> None:
        ex.observed.append((rows, seconds))
        observe(rows, seconds)

    engine.costs.observe_forward = observed  # type: ignore[method-assign]
    specs = [spec(i, [5 + i] * (3 + 2 * i), 5 + 2 * i) for i in range(5)]
    return engine.run(specs, tok.eos_token_id), ex, stream


WINDOWS = {
    "immediate": ["output=immediate"],
    "window 1": ["output=deferred", "window=1"],
    "window 4": ["output=deferred", "window=4"],
}


@pytest.mark.parametrize("output", list(WINDOWS.values()), ids=list(WINDOWS))
@pytest.mark.parametrize("complete_on_fetch", [True, False], ids=["drains", "run end"])
def test_each_step_reports_its_device_seconds_once_read(
    tiny: tuple[Any, Any], output: list[str], complete_on_fetch: bool
) -> None:
    """Read at the drains (the events done when the step's copy was waited for), or, where
    the device never said so during the run, at its end after one wait; never waited for in
    a step. Each step's row: forward and sample the device's, host the launches."""
    result, ex, stream = spanned_run(tiny, output, complete_on_fetch)
    assert ex.waits_in_steps == 0  # no step waited for an event
    assert stream.waits == (0 if complete_on_fetch else 1)  # the run's end: one wait
    steps = result.steps
    assert len(steps) == len(ex.device) > 5
    if output != WINDOWS["immediate"]:
        assert any(st.held_steps for st in steps)  # tokens were held past their step
    for st, (fwd, smp), (launch_f, launch_s) in zip(steps, ex.device, ex.launch, strict=True):
        assert st.phase_s["forward"] == pytest.approx(fwd, rel=1e-12)
        assert st.phase_s["sample"] == pytest.approx(smp, rel=1e-12)
        assert st.phase_s["host"] == pytest.approx(launch_f + launch_s, rel=1e-12)
    # the cost of a decode row (adaptive output) is fitted to the device's seconds, not the
    # launches: each decode-only step observed once, when read
    assert ex.decode_steps and sorted(ex.observed) == sorted(ex.decode_steps)
    summary = summarize(result)
    assert summary["forward_time"] == "device"
    assert summary["busy_s"] == pytest.approx(sum(f + s for f, s in ex.device), rel=1e-9)
    # the host's timeline (every phase but the device's two) is what step_mean_s averages
    host = sum(v for st in steps for p, v in st.phase_s.items() if p not in ("forward", "sample"))
    assert summary["step_mean_s"] == pytest.approx(host / len(steps), rel=1e-9)


def test_a_cpu_run_is_as_before(tiny: tuple[Any, Any]) -> None:
    """No span on a CPU: each step's forward and sample are the executor's host seconds, as
    they always were, and nothing goes to `host`."""
    model, tok = tiny
    cfg = make_cfg("model=tiny", "engine.block_size=4", "output=deferred", "window=2")
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, NullHooks())
    inner, seen = engine.executor.execute, []

    def execute(batch: Any) -> Any:
        result = inner(batch)
        assert result.span is None
        seen.append((result.forward_s, result.sample_s))
        return result

    engine.executor.execute = execute
    result = engine.run([spec(i, [7] * (4 + i), 6) for i in range(3)], tok.eos_token_id)
    assert [(st.phase_s["forward"], st.phase_s["sample"]) for st in result.steps] == seen
    assert all(st.phase_s["host"] == 0.0 for st in result.steps)
    assert DEVICE_TIMED.keys().isdisjoint(result.executor)
    assert DEVICE_TIMED.keys().isdisjoint(summarize(result))


# ---- the calibration recorder -------------------------------------------------------------
class FakeResult:
    def __init__(self, span: DeviceSpan | None, k: int) -> None:
        self.tokens: list[int] = [k]
        self.forward_s, self.sample_s, self.prepare_s = 1e-4 * (k + 1), 1e-5, 2e-5
        self.span = span


class FakeExecutor:
    def __init__(self, stream: FakeStream | None) -> None:
        self.stream = stream
        self.calls = 0

    def execute(self, batch: Any) -> FakeResult:
        k, self.calls = self.calls, self.calls + 1
        span = fake_span(self.stream, 2.0 + k, 0.25) if self.stream else None
        return FakeResult(span, k)


def batch() -> StepBatch:
    sampling = SamplingParams(max_tokens=4)
    row = Row("r", [1, 2], 0, [0, 1], [0], 2, sampling, 0)
    return StepBatch([row])


def test_the_recorder_reads_the_spans_after_its_run_with_one_wait() -> None:
    stream = FakeStream()
    rec = Recorder(FakeExecutor(stream), torch.device("cuda"))  # no GPU needed: a fake
    for _ in range(3):
        rec.execute(batch())
    assert stream.waits == 0
    assert [s[1] for s in rec.steps] == pytest.approx([1e-4, 2e-4, 3e-4])  # launches so far
    rec.close()
    assert stream.waits == 1  # the newest span waited for; the older ones were done by then
    assert [s[1] for s in rec.steps] == pytest.approx([2e-3, 3e-3, 4e-3])
    assert [s[2] for s in rec.steps] == pytest.approx([0.25e-3] * 3)
    assert [s[3] for s in rec.steps] == [2e-5] * 3  # preparation: the host's, as measured


def test_on_a_cpu_the_recorder_keeps_the_executors_seconds() -> None:
    rec = Recorder(FakeExecutor(None), torch.device("cpu"))
    rec.execute(batch())
    rec.close()
    assert rec.steps[0][1:] == (1e-4, 1e-5, 2e-5)


def test_the_recorder_times_the_drains_of_a_gpu_run_by_step() -> None:
    class Readback:
        def fetch(self, pending: list[Any]) -> list[int]:
            return [1] * len(pending)

    class Engine:
        def __init__(self) -> None:
            self.readback = Readback()
            self.steps: list[int] = []

    engine = Engine()
    untouched = engine.readback.fetch
    cpu = Recorder(FakeExecutor(None), torch.device("cpu"))
    cpu.watch(engine)
    assert cpu.fetch_s is None and engine.readback.fetch == untouched
    rec = Recorder(FakeExecutor(None), torch.device("cuda"))
    rec.watch(engine)
    assert engine.readback.fetch([0, 0]) == [1, 1]
    engine.steps.append(0)
    engine.readback.fetch([0])
    engine.readback.fetch([0])
    assert rec.fetch_s is not None and sorted(rec.fetch_s) == [0, 1]


def test_host_seconds_on_a_gpu_keep_the_launches_and_drop_the_drains() -> None:
    st = stats(0)
    st.transfers = 2
    st.phase_s = {"build": 1.0, "output": 0.5, "forward": 9.0, "host": 0.25}
    assert host_seconds(st, 0.125) == pytest.approx(1.5 - 2 * 0.125)  # a CPU's, as before
    assert host_seconds(st, 0.125, 0.375) == pytest.approx(1.5 + 0.25 - 0.375)
    run = PointRun(None, [], [st, st], 0.0, 0.0, fetch_s={1: 0.375})  # type: ignore[arg-type]
    assert run.host(0.125) == pytest.approx([1.75, 1.375])
    run.fetch_s = None
    assert run.host(0.125) == pytest.approx([1.25, 1.25])


# ---- the simulator check's GPU mode, dry run on the CPU -----------------------------------
def tiny_profile(tiny: tuple[Any, Any]) -> MeasuredProfile:
    """A hand-made measured profile of the tiny model: the check, not a calibration."""
    meta = {"model_id": model_id(tiny[0].config), "model": "tiny", "dtype": "float32"}
    forward = LinearCost(1e-3, {"linear_tokens": 1e-5, "decode_ctx": 1e-8})
    return MeasuredProfile(meta, forward, LinearCost(5e-5, {"rows": 1e-6}))


def test_a_gpu_name_gives_its_hardware_spec() -> None:
    names = {
        "NVIDIA H200": "h200",
        "NVIDIA H100 80GB HBM3": "h100-sxm",
        "NVIDIA A100-SXM4-80GB": "a100-80gb",
        "NVIDIA A100 80GB PCIe": "a100-80gb-pcie",
        "NVIDIA A100-SXM4-40GB": "a100-40gb",
        "Tesla T4": None,
    }
    assert {n: check_gpu.hardware_for(n) for n in names} == names


def test_the_gpu_modes_dry_run_sets_real_runs_against_both_simulations(
    tmp_path: Path, tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measured profile made by the calibration (here a stand-in: the calibration has its
    own test), the analytic one from the hardware spec; every metric of every case real,
    analytic and measured, with the ratio and a verdict that follows from it."""
    asked: list[tuple[list[str], list[str], dict[str, Any]]] = []

    def calibrate(overrides: list[str], grid: list[Any], **kw: Any) -> tuple[Any, list, None]:
        asked.append((overrides, [p.name for p in grid], kw))
        return tiny_profile(tiny), [], None

    monkeypatch.setattr(fitting, "calibrate", calibrate)
    argv = ["--dry-run", "--workloads", "straggler", "--threads", "1", "--out", str(tmp_path)]
    out = sim_check.main(argv)
    ((overrides, grid, kw),) = asked
    assert grid == [p.name for p in quick_grid()] and kw["gated"] is False
    assert "device=cpu" in overrides and "model=tiny" in overrides
    assert load_cost_model(out / "measured-profile.yaml").kind == "measured"
    assert load_cost_model(out / "analytic-h200.yaml").kind == "analytic"

    data = json.loads((out / "sim_check_gpu.json").read_text())
    header, rows = data["header"], data["rows"]
    assert "SIMULATED" in header["what"] and "DRY RUN" in header
    assert (
        "analytic-h200.yaml" in header["analytic"]
        and "calibrated now" in header["measured profile"]
    )
    combos = (REFERENCE, check_cases.DEFERRED)
    cases = [check_cases.Case("straggler", c, True).name for c in combos]
    assert [(r["case"], r["metric"]) for r in rows] == [
        (c, m) for c in cases for m in check_gpu.METRICS
    ]
    for r in rows:
        assert r["real"] is not None and r["real"] >= 0, r
        for side in check_gpu.SIDES:
            q = r[f"{side}_ratio"]
            assert r[side] is not None
            if not r["real"]:  # no real value to set it against (a TPOT of tokens in bursts)
                assert q is None and r[f"{side}_verdict"] == "-"
                continue
            assert q == pytest.approx(r[side] / r["real"])
            assert r[f"{side}_verdict"] == ("within 10%" if abs(q - 1) <= 0.10 else "missed")
    md = (out / "sim_check_gpu.md").read_text()
    assert "| case | metric | real | analytic (simulated) | measured profile (simulated) |" in md
    assert "Failed runs" not in md


def test_a_failed_run_fails_the_gpu_mode_after_its_report(
    tmp_path: Path, tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "tiny.yaml"
    tiny_profile(tiny).write(profile)
    serve = check_gpu.serve_real

    def failing(setup: Any, case: Any, specs: Any) -> Any:
        if case.combo == check_cases.DEFERRED:
            raise RuntimeError("the device went away")
        return serve(setup, case, specs)

    monkeypatch.setattr(check_gpu, "serve_real", failing)
    argv = ["--dry-run", "--workloads", "straggler", "--profile", str(profile)]
    with pytest.raises(SystemExit) as exit:
        sim_check.main([*argv, "--threads", "1", "--out", str(tmp_path / "out")])
    assert exit.value.code == 1
    md = (tmp_path / "out" / "sim_check_gpu.md").read_text()
    assert "## Failed runs" in md and "RuntimeError: the device went away" in md
    rows = json.loads((tmp_path / "out" / "sim_check_gpu.json").read_text())["rows"]
    done = [r for r in rows if "error" not in r]
    assert {r["case"] for r in done} == {check_cases.Case("straggler", REFERENCE, True).name}
    assert len(done) == len(check_gpu.METRICS)
