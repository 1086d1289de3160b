"""Bad input is refused before any work, naming the field and what is allowed; a run that
stops early (a crashing observer or policy, a broken invariant, Ctrl-C) still writes what it
measured, marked incomplete, tells the observers, and re-raises."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

import framework.engine.loop as engine_module
import framework.run.app as app
from framework.api.hookspecs import hookimpl
from framework.api.policy import PolicyError
from framework.core.request import RequestSpec, SamplingParams
from framework.engine.invariants import InvariantError
from framework.plugin_host.faults import GuardedHooks, HookError
from framework.plugin_host.registry import Provider, registry
from framework.run.errors import Refused, UserError
from framework.run.observers import run_with_observers
from framework.run.summary import summarize
from plugins.schedulers.continuous import ContinuousScheduler
from tests.helpers import ROOT, assert_refused, cli, make_cfg, run_engine

QUICK = ("model=tiny", "workload=straggler", "print_outputs=false")


# ---- faults: results so far are written, marked incomplete, and the error is raised ---------


class Recorder:
    """An observer that records what it is told and can fail on purpose at step `fail_at`."""

    def __init__(
        self, fail_at: int | None = None, exc: BaseException | None = None, hook: str = "step"
    ) -> None:
        self.fail_at, self.exc, self.hook = fail_at, exc, hook
        self.aborts: list[tuple[BaseException, dict[str, Any]]] = []
        self.ended: list[dict[str, Any]] = []
        self.finished = 0

    @hookimpl
    def on_step_end(self, stats: Any) -> None:
        if self.hook == "step" and stats.step == self.fail_at:
            assert self.exc is not None
            raise self.exc

    @hookimpl
    def on_request_finished(self, request: Any) -> None:
        self.finished += 1
        if self.hook == "finished" and self.finished == self.fail_at:
            assert self.exc is not None
            raise self.exc

    @hookimpl
    def on_run_end(self, run: Any, summary: dict[str, Any]) -> None:
        self.ended.append(summary)

    @hookimpl
    def on_run_abort(self, run: Any, error: BaseException, summary: dict[str, Any]) -> None:
        self.aborts.append((error, summary))


@pytest.fixture
def observe(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Install observers under names (`observers=[name]`), as a plugin package would."""

    def install(name: str, obs: Recorder, dist: str = "test-observers") -> str:
        monkeypatch.setitem(registry().observers, name, (lambda cfg: obs, Provider("tests", dist)))
        return f"observers=[{name}]"

    return install


def read_results(out: Path) -> tuple[dict[str, Any], list[dict[str, str]], list[dict[str, str]]]:
    metrics = json.loads((out / "metrics.json").read_text())
    with (out / "requests.csv").open() as f:
        requests = list(csv.DictReader(f))
    with (out / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert (out / "outputs.jsonl").is_file()
    return metrics, requests, steps


def test_complete_run_is_marked_complete(tmp_path: Path, observe) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder()
    run_with_observers(make_cfg(*QUICK, observe("rec", rec)), tmp_path)
    metrics, requests, _ = read_results(tmp_path)
    assert metrics["incomplete"] is False and "error" not in metrics
    assert len(requests) == 8 and not rec.aborts
    assert rec.ended[0]["incomplete"] is False


def test_observer_raising_in_a_hook_is_named_and_results_are_kept(
    tmp_path: Path,
    observe,  # type: ignore[no-untyped-def]
) -> None:
    rec = Recorder(fail_at=5, exc=ValueError("boom"))
    with pytest.raises(HookError) as info:
        run_with_observers(make_cfg(*QUICK, observe("bad", rec)), tmp_path)
    message = "observer plugin 'observer:bad' (test-observers) raised in on_step_end: "
    assert str(info.value) == message + "ValueError('boom')"
    assert info.value.plugin == "observer:bad" and info.value.hook == "on_step_end"
    metrics, requests, steps = read_results(tmp_path)
    assert metrics["incomplete"] is True
    assert metrics["error"] == f"HookError: {message}ValueError('boom')"
    assert len(steps) == 5  # steps 0..4 ended; step 5 stopped inside its observer
    assert len(requests) == 8 and metrics["steps"] == 5
    assert metrics["tokens_kept"] > 0 and metrics["requests_finished"] < 8
    (error, summary), *_ = rec.aborts
    assert error is info.value and summary["incomplete"] is True and not rec.ended


def test_observer_raising_when_a_request_finishes_is_named(tmp_path: Path, observe) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder(fail_at=2, exc=RuntimeError("disk full"), hook="finished")
    with pytest.raises(HookError, match=r"'observer:bad' .* raised in on_request_finished"):
        run_with_observers(make_cfg(*QUICK, observe("bad", rec)), tmp_path)
    assert read_results(tmp_path)[0]["incomplete"] is True


def test_the_other_observers_are_told_which_one_failed(tmp_path: Path, observe) -> None:  # type: ignore[no-untyped-def]
    """Two observers: the culprit is named, not whoever was called first or last."""
    good, bad = Recorder(), Recorder(fail_at=1, exc=KeyError("x"))
    observe("good", good)
    observe("bad", bad)
    with pytest.raises(HookError, match=r"^observer plugin 'observer:bad'"):
        run_with_observers(make_cfg(*QUICK, "observers=[good,bad]"), tmp_path)
    assert len(good.aborts) == len(bad.aborts) == 1


def test_scheduler_raising_mid_run_keeps_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, observe
) -> None:  # type: ignore[no-untyped-def]
    calls = {"n": 0}
    admit = ContinuousScheduler.admit

    def exploding_admit(self, view):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 4:
            raise ZeroDivisionError("bad arithmetic")
        return admit(self, view)

    monkeypatch.setattr(ContinuousScheduler, "admit", exploding_admit)
    rec = Recorder()
    with pytest.raises(PolicyError, match=r"scheduler policy 'continuous' .*raised in admit"):
        run_with_observers(make_cfg(*QUICK, observe("rec", rec)), tmp_path)
    metrics, _, steps = read_results(tmp_path)
    assert metrics["incomplete"] is True and metrics["error"].startswith("PolicyError: ")
    assert len(steps) == 3 and len(rec.aborts) == 1


def test_allocator_raising_in_blocks_to_grow_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine guards its per-row `blocks_to_grow` loop once, not per call: a crash in
    it must still name the plugin and the method."""
    from plugins.allocators.incremental import IncrementalAllocator

    def exploding(self, seq, block_size, lookahead):  # type: ignore[no-untyped-def]
        raise KeyError("no such block")

    monkeypatch.setattr(IncrementalAllocator, "blocks_to_grow", exploding)
    with pytest.raises(
        PolicyError, match=r"allocator policy 'incremental' .*raised in blocks_to_grow: KeyError"
    ):
        run_with_observers(make_cfg(*QUICK), tmp_path)


def test_broken_invariant_keeps_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, observe
) -> None:  # type: ignore[no-untyped-def]
    real = engine_module.check_step
    calls = []

    def check_step(batch, **state):  # type: ignore[no-untyped-def]
        real(batch, **state)
        calls.append(batch)
        if len(calls) == 3:  # after two whole steps, the third one's check fails
            raise InvariantError("books do not balance")

    monkeypatch.setattr(engine_module, "check_step", check_step)
    with pytest.raises(InvariantError):
        run_with_observers(make_cfg(*QUICK, observe("rec", Recorder())), tmp_path)
    metrics, _, steps = read_results(tmp_path)
    assert metrics["error"] == "InvariantError: books do not balance" and len(steps) == 2


def test_ctrl_c_keeps_results_and_tells_the_observers(tmp_path: Path, observe) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder(fail_at=3, exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run_with_observers(make_cfg(*QUICK, observe("ctrl_c", rec)), tmp_path)
    metrics, requests, steps = read_results(tmp_path)
    assert metrics["incomplete"] is True and metrics["error"] == "KeyboardInterrupt"
    assert len(steps) == 3 and len(requests) == 8
    (error, summary), *_ = rec.aborts
    assert isinstance(error, KeyboardInterrupt) and summary["error"] == "KeyboardInterrupt"


def test_an_abort_hook_that_fails_does_not_hide_the_error(tmp_path: Path, observe) -> None:  # type: ignore[no-untyped-def]
    class BadAbort(Recorder):
        @hookimpl
        def on_run_abort(self, run: Any, error: BaseException, summary: dict[str, Any]) -> None:
            raise OSError("tracking server down")

    with pytest.raises(HookError, match="raised in on_step_end") as info:
        run_with_observers(
            make_cfg(*QUICK, observe("bad", BadAbort(fail_at=1, exc=ValueError("boom")))),
            tmp_path,
        )
    assert any("on_run_abort failed" in note for note in info.value.__notes__)
    assert read_results(tmp_path)[0]["incomplete"] is True


def test_guarded_hooks_without_pluggy_name_the_hook() -> None:
    class Relay:
        def on_step_end(self, **kwargs: Any) -> None:
            raise ValueError("x")

    with pytest.raises(HookError, match=r"a plugin raised in on_step_end \(implemented by: none\)"):
        GuardedHooks(Relay()).on_step_end(stats=None)


# ---- bad input: refused before any work, naming the field and what is allowed --------------


def _write_inputs(tmp: Path) -> None:
    (tmp / "cols.csv").write_text("time,prompt,output\n2023-11-16 18:15:46,10,5\n")
    (tmp / "row.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,10,5\n"
        "2023-11-16 18:15:47.1000000,ten,5\n"
    )
    (tmp / "bad.jsonl").write_text('{"prompt": "hi", "max_tokens": 4}\n{"prompt": "hi",\n')
    (tmp / "bert").mkdir()
    (tmp / "bert" / "config.json").write_text('{"architectures": ["BertModel"]}')


FIXED = ("workload=fixed", "workload.prompt_lens=[30,40]", "workload.output_lens=[10,10]")
# (overrides, message, checked before the model loads?)
BAD_INPUT: list[tuple[tuple[str, ...], str, bool]] = [
    (
        ("+engine.foo=1",),
        "engine.foo is not a setting of the engine group; its settings "
        "are: max_num_seqs, max_num_batched_tokens, block_size",
        True,
    ),
    (
        ("+model.foo=1",),
        "model.foo is not a setting of the model group; its settings are: source, path",
        True,
    ),
    (
        ("+model.tiny.depth=1",),
        "model.tiny.depth is not a setting of the model.tiny group; its settings are: hidden_size",
        True,
    ),
    (
        ("+windw=4",),
        "windw is not a setting of the top level; its settings are: scheduler, allocator",
        True,
    ),
    (
        ("+scheduler.foo=1",),
        "scheduler.foo is not an option of scheduler 'continuous' "
        "(nanoserve); its options are: name",
        True,
    ),
    (("+workload.foo=1",), "workload.foo is not a field of workload kind 'fixed'", True),
    (
        ("preemption.victim=random",),
        "preemption.victim must be one of newest, oldest, most_blocks; got 'random'",
        True,
    ),
    (("window=-1",), "window must be >= 0", True),
    (("output=deferred", "window=-2"), "window (output.window) must be >= 0; got -2", True),
    (("output=adaptive", "output.max_window=-1"), "output.max_window must be >= 0", True),
    (("engine.max_num_seqs=0",), "engine.max_num_seqs must be >= 1, got 0", True),
    (("engine.max_num_seqs=-4",), "engine.max_num_seqs must be >= 1, got -4", True),
    (("engine.block_size=0",), "engine.block_size must be >= 1, got 0", True),
    (("engine.max_num_batched_tokens=0",), "engine.max_num_batched_tokens must be >= 1", True),
    (("engine.num_blocks=0",), "engine.num_blocks must be >= 1 (or null", True),
    (("engine.kv_memory_mb=0",), "engine.kv_memory_mb must be > 0, got 0.0", True),
    (("threads=0",), "threads must be >= 1 (or null: torch's default), got 0", True),
    (("model.max_model_len=0",), "model.max_model_len must be >= 1", True),
    (("workload=synthetic", "workload.rate=0"), "workload.rate must be > 0; got 0.0", True),
    (("workload=synthetic", "workload.rate=-2"), "workload.rate must be > 0; got -2.0", True),
    (("workload=synthetic", "workload.num_requests=0"), "workload.num_requests must be >= 1", True),
    (
        ("workload=synthetic", "workload.arrival=steady"),
        "workload.arrival must be one of poisson, gamma, burst; got 'steady'",
        True,
    ),
    (("workload.seed=-1",), "workload.seed must be >= 0; got -1", True),
    (
        ("workload=fixed", "workload.prompt_lens=[4,0]", "workload.output_lens=[1,1]"),
        "workload.prompt_lens[1] must be >= 1; got 0",
        True,
    ),
    (
        (*FIXED, "engine.block_size=4", "engine.num_blocks=5"),
        "the KV pool holds 5 blocks of 4 tokens (engine.num_blocks=5); the largest request "
        "needs 13 blocks, the smallest 10: set engine.num_blocks >= 13",
        True,
    ),
    (
        (*FIXED, "engine.max_num_batched_tokens=32", "engine.max_num_seqs=4"),
        "engine.max_num_batched_tokens = 32 (a request, or a preempted one, is prefilled "
        "whole): set it >= 50",
        True,
    ),
    ((*FIXED, "model.max_model_len=16"), "the model's context is 16 tokens", True),
    (
        (*FIXED, "engine.block_size=16", "engine.kv_memory_mb=0.02"),
        "the KV pool holds 2 blocks of 16 tokens (engine.kv_memory_mb=0.02); the largest "
        "request needs 4 blocks",
        False,
    ),
    (("model=hf",), "model=hf needs model.path=DIR (a local Hugging Face model folder)", True),
    (("model=hf", "model.path={tmp}/missing"), "model.path={tmp}/missing: no such directory", True),
    (
        ("model=hf", "model.path={tmp}/bert"),
        "model.path={tmp}/bert is not a causal LM (architectures: ['BertModel'])",
        True,
    ),
    (("device=cuda:99",), "device=cuda:99: ", True),
    (("device=tpu",), "device must be one of auto, cpu, cuda, cuda:N; got 'tpu'", True),
    (("dtype=int8",), "dtype must be one of float32, bfloat16, float16; got 'int8'", True),
    (("observers=[nope]",), "observers: 'nope' is not registered; available: console", True),
    (
        ("workload=trace", "workload.path={tmp}/none.csv"),
        "workload.path: trace file not found: {tmp}/none.csv",
        True,
    ),
    (
        ("workload=trace", "workload.path={tmp}/cols.csv"),
        "{tmp}/cols.csv: a trace needs the "
        "columns TIMESTAMP, ContextTokens, GeneratedTokens; found time, prompt, output",
        True,
    ),
    (
        ("workload=trace", "workload.path={tmp}/row.csv"),
        "{tmp}/row.csv:3: ContextTokens 'ten' is not an integer",
        True,
    ),
    (
        ("workload=jsonl", "workload.path={tmp}/bad.jsonl"),
        "{tmp}/bad.jsonl:2: not valid JSON",
        True,
    ),
]


@pytest.mark.parametrize(
    ("overrides", "expected", "before_loading"),
    BAD_INPUT,
    ids=[" ".join(o) for o, _, _ in BAD_INPUT],
)
def test_bad_input_is_refused_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    overrides: tuple[str, ...],
    expected: str,
    before_loading: bool,
) -> None:
    """Each refusal as the user meets it: `python run.py ...` exits 2 with one `error:`
    line naming the field, no traceback, and no result written; and the same check raises
    `UserError` (a ValueError) for callers of `serve` (notebooks, the benchmark)."""
    _write_inputs(tmp_path)
    if before_loading:

        def no_loading(cfg: Any) -> None:
            raise AssertionError("the model was loaded before the bad input was found")

        monkeypatch.setattr(app, "load", no_loading)
    out = tmp_path / "out"
    args = ["model=tiny", "workload=straggler", "observers=[console]"]
    args += [o.format(tmp=tmp_path) for o in overrides]
    status, _, err = cli(capsys, *args, f"hydra.run.dir={out}")
    assert_refused(status, err, expected.format(tmp=tmp_path))
    assert not list(out.glob("*.json*")) and not list(out.glob("*.csv")), "results were written"

    cfg = make_cfg(*args)
    with pytest.raises(UserError, match=re.escape(expected.format(tmp=tmp_path))):
        run_with_observers(cfg, tmp_path / "direct")
    assert not (tmp_path / "direct").exists(), "nothing may be written for a refused run"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("engine.foo=1",), "engine.foo is not a setting of the engine group; its settings are: "),
        (("scheduler.foo=1",), "scheduler.foo is not a setting of the scheduler group"),
        (("engine.block_size=abc",), "engine.block_size=abc: Value 'abc' of type 'str' could not"),
        (("model=nope",), "model=nope: no such choice; model accepts hf, smollm2, tiny"),
        (("+experiment=nope",), "experiment=nope: no such choice; experiment accepts allocation"),
        (
            ("scheduler=fifo",),
            "unknown policy scheduler=fifo; scheduler offers chunked (nanoserve), continuous",
        ),
        (("-m", "scheduler=static,fifo"), "unknown policy scheduler=fifo"),
        (("-m", "engine.block_size=4,abc"), "engine.block_size=abc: Value 'abc'"),
    ],
)
def test_what_hydra_refuses_is_one_line_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: tuple[str, ...], expected: str
) -> None:
    """Composition errors (an unknown key or choice, a value of the wrong type) come from
    Hydra and OmegaConf; the user sees them in the same one-line form."""
    dirs = (f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep")
    flags = [o for o in overrides if o.startswith("-")]  # `-m` goes before the overrides
    rest = [o for o in overrides if not o.startswith("-")]
    status, _, err = cli(capsys, *flags, "model=tiny", "observers=[console]", *rest, *dirs)
    assert_refused(status, err, expected)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("model=tiny", "-m", "scheduler=static,continuous"), "flags such as -m go before"),
        (("--cfg", "jobs"), "argument --cfg/-c: invalid choice: 'jobs'"),
    ],
)
def test_a_flag_hydra_cannot_read_is_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], expected: str
) -> None:
    assert_refused(*cli(capsys, *args)[::2], expected)


def test_a_refused_job_in_a_sweep_is_named_and_the_jobs_before_it_keep_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep"
    args = ("-m", "model=tiny", "workload=straggler", "observers=[console]")
    status, _, err = cli(capsys, *args, f"hydra.sweep.dir={sweep}", "engine.block_size=16,0")
    assert_refused(status, err, "job 1 (")
    assert "engine.block_size=0): engine.block_size must be >= 1, got 0" in err
    assert json.loads((sweep / "0" / "metrics.json").read_text())["incomplete"] is False
    assert not (sweep / "1" / "metrics.json").exists()


# A bug planted mid-run, in a process of its own: the engine's own code getting a config key
# wrong (an OmegaConf error, which must not pass for a user's mistake because its type is one
# Hydra also raises). A process costs seconds of imports, so the other kind of bug, a plugin
# that raises (named by the engine as a PolicyError), is planted in this process below: `main`
# raising it, rather than returning a status, is what makes the interpreter print its
# traceback and exit 1, as this process's test shows for the first kind.
BUG_KEY_MISSING = (
    "import framework.run.app as app\n"
    "from omegaconf import OmegaConf\n"
    "def broken(tokenizer, result):\n"
    "    cfg = OmegaConf.create({'a': 1})\n"
    "    OmegaConf.set_struct(cfg, True)\n"
    "    return cfg.no_such_key\n"
    "app.decode_outputs = broken\n"
)


def test_a_bug_keeps_its_traceback_and_exits_1(tmp_path: Path) -> None:
    """Anything that is not the user's input is a bug: a traceback, exit status 1, and the
    partial results written."""
    script = (
        f"import sys\nfrom framework.run.cli import main\n{BUG_KEY_MISSING}sys.exit(main(["
        "'model=tiny', 'workload=straggler', 'observers=[console]', "
        f"'hydra.run.dir={tmp_path}']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback (most recent call last)" in proc.stderr
    assert "omegaconf.errors.ConfigAttributeError" in proc.stderr, proc.stderr[-3000:]
    assert not any(line.startswith("error: ") for line in proc.stderr.splitlines())
    assert json.loads((tmp_path / "metrics.json").read_text())["incomplete"] is True


def test_a_policy_bug_is_raised_out_of_main_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin that raises mid-run is a bug too: `main` lets it out (the interpreter then
    prints its traceback and exits 1) instead of printing an `error:` line, and the partial
    results are written."""
    admit = ContinuousScheduler.admit

    def broken(self, view):  # type: ignore[no-untyped-def]
        if view.step == 2:
            raise RuntimeError("boom")
        return admit(self, view)

    monkeypatch.setattr(ContinuousScheduler, "admit", broken)
    args = ("model=tiny", "workload=straggler", "observers=[console]", f"hydra.run.dir={tmp_path}")
    with pytest.raises(PolicyError) as raised:
        cli(capsys, *args)
    trace = "".join(traceback.format_exception(raised.value))
    assert trace.startswith("Traceback (most recent call last)")
    assert "PolicyError: scheduler policy 'continuous' (nanoserve) raised in admit" in trace
    err = capsys.readouterr().err
    assert not any(line.startswith("error: ") for line in err.splitlines()), err
    assert json.loads((tmp_path / "metrics.json").read_text())["incomplete"] is True


def test_hydra_full_error_shows_the_whole_trace_of_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(Refused, match=r"engine\.block_size must be >= 1"):
        cli(capsys, "model=tiny", "engine.block_size=0", f"hydra.run.dir={tmp_path}")


def test_unknown_key_without_plus_is_named_by_hydra() -> None:
    """Hydra refuses `engine.foo=1` while composing and names the key; with `+`, the
    check above lists the allowed settings."""
    with pytest.raises(Exception, match=r"engine\.foo"):
        make_cfg("model=tiny", "engine.foo=1")


def test_requests_that_can_never_run_are_rejected_and_the_rest_run(tmp_path: Path) -> None:
    cfg = make_cfg(
        "model=tiny",
        "workload=fixed",
        "workload.prompt_lens=[10,60,12]",
        "workload.output_lens=[5,5,4]",
        "engine.block_size=4",
        "engine.num_blocks=10",
        "print_outputs=false",
    )
    run_with_observers(cfg, tmp_path)
    metrics, requests, _ = read_results(tmp_path)
    assert metrics["incomplete"] is False
    assert (metrics["requests_finished"], metrics["requests_rejected"]) == (2, 1)
    rejected = next(r for r in requests if r["id"] == "r1")
    assert rejected["status"] == "rejected"
    assert "prompt + max_tokens = 65 needs 17 blocks; the pool has 10" in rejected["reject_reason"]
    outputs = [json.loads(x) for x in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert {o["id"]: o["finish_reason"] for o in outputs} == {
        "r0": "length",
        "r1": "rejected",
        "r2": "length",
    }


# ---- progress --------------------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["newest", "oldest", "most_blocks"])
def test_static_batch_under_a_tight_pool_makes_progress(tiny: Any, victim: str) -> None:
    """A pool that fits the largest request must finish every request. In a static batch a
    finished row keeps its blocks, so the one row still growing may have to be preempted
    itself (it is readmitted alone once the batch ends)."""
    model, tok = tiny
    specs = [
        RequestSpec("a", [5, 6, 7, 8], SamplingParams(max_tokens=2, ignore_eos=True)),
        RequestSpec("b", [9, 10, 11, 12], SamplingParams(max_tokens=20, ignore_eos=True)),
    ]
    cfg = make_cfg(
        "model=tiny",
        "scheduler=static",
        "allocator=incremental",
        f"preemption.victim={victim}",
        "engine.block_size=4",
        "engine.num_blocks=6",  # b alone needs (4 + 20) / 4 = 6 blocks
    )
    s = summarize(run_engine(cfg, model, tok, specs))
    assert s["requests_finished"] == 2 and s["preemptions"] == 1
    assert s["max_preemptions_per_request"] == 1
