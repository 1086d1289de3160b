"""Properties of every run, on random workloads under random policies, pools and windows.

For each example: a workload (prompt lengths, budgets, arrivals, stop tokens, greedy or
seeded sampling, priorities, samples per request, forked over their prompt), a policy
combination (every scheduler x allocator x preemption x output, windows 0..16), a block size
and a pool that fits the largest request. Then:
- every request finishes (no livelock: the run ends within a step bound) with exactly the
  tokens of the reference, static + worst_case + immediate on a big pool;
- it is owed exactly those: `length` means max_tokens tokens, `stop` ends at the first stop;
- deferred tokens = kept + overshoot; no block leaks or has two owners (the
  engine's own end check); no step holds more than the window;
- no request is preempted more often than it got tokens (each admission yields a token
  before the row can be preempted again), the progress guarantee.

Stop tokens are drawn from the reference continuation, so they really fire. Seeded sampling
draws token i of a request from (seed, i) alone, so it too is policy independent; a
request's samples are each the request alone with its sample's seed.

`pytest tests/test_properties.py` runs the reproducible default profile (tests/conftest.py);
`--hypothesis-profile=long` runs many more fresh examples.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sample_group import sample_specs
from framework.engine.loop import RunResult
from framework.run.app import build_engine
from framework.run.summary import summarize
from tests.helpers import check_same_greedy, make_cfg

SCHEDULERS = ("static", "continuous", "priority", "sjf", "chunked", "lpm")
# Chunked prefill: one token, an odd size, one (default) block, and the step budget only.
CHUNK_SIZES = ("1", "7", "16", "null")
# Incremental twice as often: it is the allocator that runs dry mid-flight and preempts.
ALLOCATORS = ("worst_case", "incremental", "incremental", "prefix_cache")
PREEMPTIONS = (
    ("preemption=recompute", "preemption.victim=newest"),
    ("preemption=recompute", "preemption.victim=oldest"),
    ("preemption=recompute", "preemption.victim=most_blocks"),
    ("preemption=priority",),
    # a host KV tier: victims swapped out and back (not with a prefix cache: refused)
    ("preemption=recompute", "preemption.mode=swap", "engine.host_kv_memory_mb=1"),
    ("preemption=priority", "preemption.mode=cheaper", "engine.host_kv_memory_mb=1"),
)
REFERENCE = ("scheduler=static", "allocator=worst_case", "output=immediate")

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def cfg_for(overrides: tuple[str, ...]) -> Any:
    """Composing costs tens of milliseconds; examples repeat overrides often."""
    return make_cfg("model=tiny", *overrides)


class StepCap:
    """The engine's hooks for these runs: fails a run that outlives its step bound (a
    livelock or endless preemption) instead of hanging the test."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def on_step_end(self, stats: Any) -> None:
        assert stats.step < self.cap, f"no progress: {self.cap} steps and still running"

    def on_request_finished(self, request: Any) -> None:
        pass


def serve(tiny: Any, overrides: tuple[str, ...], specs: list[RequestSpec], cap: int) -> RunResult:
    model, tok = tiny
    engine = build_engine(
        cfg_for(overrides), model, torch.device("cpu"), torch.float32, StepCap(cap)
    )
    return engine.run(specs, tok.eos_token_id)


# ---- strategies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A request before its stop token is known (that needs the reference's continuation)."""

    prompt: tuple[int, ...]
    max_tokens: int
    arrival: float
    sampling: tuple[float, int, float]  # temperature, top_k, top_p (temperature 0: greedy)
    seed: int
    ignore_eos: bool
    wants_stop: bool
    priority: int
    n: int  # samples of the prompt (parallel sampling, forked over its blocks)

    def spec(self, rid: str, stop: tuple[int, ...] = (), arrival: float | None = None):  # type: ignore[no-untyped-def]
        temperature, top_k, top_p = self.sampling
        return RequestSpec(
            rid,
            list(self.prompt),
            SamplingParams(
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=self.seed,
                max_tokens=self.max_tokens,
                ignore_eos=self.ignore_eos,
                stop_token_ids=stop,
                n=self.n,
            ),
            arrival=self.arrival if arrival is None else arrival,
            priority=self.priority,
        )


def shapes(vocab: int) -> st.SearchStrategy[Shape]:
    greedy = st.just((0.0, 0, 1.0))
    sampled = st.tuples(
        st.sampled_from([0.7, 1.0]), st.sampled_from([0, 20]), st.sampled_from([1.0, 0.9])
    )
    return st.builds(
        Shape,
        prompt=st.integers(1, 40).flatmap(
            lambda n: st.lists(st.integers(3, vocab - 1), min_size=n, max_size=n).map(tuple)
        ),
        max_tokens=st.integers(1, 24),
        # Mostly together (queues build); some a few milliseconds apart (open loop).
        arrival=st.one_of(st.just(0.0), st.floats(0.0, 0.03)),
        sampling=st.one_of(greedy, sampled),
        seed=st.integers(0, 2**16),
        ignore_eos=st.booleans(),
        wants_stop=st.booleans(),
        priority=st.integers(0, 2),
        n=st.sampled_from([1, 1, 1, 2, 3]),
    )


@st.composite
def policies(draw: st.DrawFn, schedulers: tuple[str, ...] = SCHEDULERS) -> tuple[str, ...]:
    output = draw(
        st.one_of(
            st.just(("output=immediate",)),
            st.integers(0, 16).map(lambda k: ("output=deferred", f"window={k}")),
            st.integers(0, 16).map(lambda k: ("output=adaptive", f"output.max_window={k}")),
        )
    )
    scheduler = draw(st.sampled_from(schedulers))
    chunk = (
        (f"scheduler.chunk_size={draw(st.sampled_from(CHUNK_SIZES))}",)
        if scheduler == "chunked"
        else ()
    )
    allocator = draw(st.sampled_from(ALLOCATORS))
    preemption = draw(st.sampled_from(PREEMPTIONS))
    if allocator == "prefix_cache" and "preemption.mode=swap" in preemption:
        preemption = PREEMPTIONS[0]
    if allocator == "prefix_cache" and "preemption.mode=cheaper" in preemption:
        preemption = PREEMPTIONS[3]
    return (f"scheduler={scheduler}", *chunk, f"allocator={allocator}", *preemption, *output)


@st.composite
def engines(draw: st.DrawFn, sizes: list[int], chunked: bool = False) -> tuple[str, ...]:
    """Block size, a pool that fits the largest request (often exactly), and budgets; under
    chunked prefill, a token budget often below the largest request (it is served anyway)."""
    bs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    need = max(-(-n // bs) for n in sizes)
    # Half the time exactly the largest request's need: the tightest pool that must work.
    tight = st.one_of(st.just(0), st.just(0), st.integers(0, 2), st.integers(0, 4 * need))
    blocks = need + draw(tight)
    seqs = draw(st.one_of(st.integers(1, 8), st.integers(2, 4)))
    low = seqs if chunked else max(max(sizes), seqs)
    tokens = draw(st.one_of(st.just(8192), st.integers(low, max(low, 2 * max(sizes)))))
    return (
        f"engine.block_size={bs}",
        f"engine.num_blocks={blocks}",
        f"engine.max_num_seqs={seqs}",
        f"engine.max_num_batched_tokens={tokens}",
    )


# ---- the property ----------------------------------------------------------------------------


def step_bound(specs: list[RequestSpec], chunked: bool = False) -> int:
    """Every step samples a token for some unfinished request, kept or overshoot (at most
    the window, 16, per request): a run that needs more steps than this is not progressing.
    Doubled, to leave the argument some slack. Under chunked prefill a step may compute
    only prompt chunks (one token each, at worst), so every prompt and recomputed token may
    cost a step too: a generous bound, still finite."""
    bound = 2 * (sum(s.sampling.max_tokens for s in specs) + 17 * len(specs)) + 10
    if chunked:
        bound += 8 * sum(len(s.prompt_token_ids) + s.sampling.max_tokens for s in specs)
    return bound


def cut_at_stop(tokens: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1]
    return tokens


@given(data=st.data())
def test_any_policy_serves_exactly_what_the_reference_serves(tiny: Any, data: Any) -> None:
    serves_the_reference(tiny, data, SCHEDULERS)


@settings(max_examples=20)
@given(data=st.data())
def test_chunked_prefill_serves_exactly_what_the_reference_serves(tiny: Any, data: Any) -> None:
    """Chunk sizes 1, 7, one block and unlimited, budgets below the largest request, with
    every allocator, preemption and output policy: the tokens of the unchunked reference."""
    serves_the_reference(tiny, data, ("chunked",))


def serves_the_reference(tiny: Any, data: Any, schedulers: tuple[str, ...]) -> None:
    model, tok = tiny
    # Mostly several requests at once (lists alone stay short): they are what competes.
    size = data.draw(st.one_of(st.integers(1, 8), st.integers(4, 8)), label="requests")
    workload = data.draw(st.lists(shapes(len(tok)), min_size=size, max_size=size), label="workload")

    # The reference continuation, without stop tokens (arrivals do not change tokens).
    # A request's samples are each the request alone with its sample's seed.
    base_specs = [
        s for i, w in enumerate(workload) for s in sample_specs(w.spec(f"r{i}", arrival=0.0))
    ]
    big = max(len(s.prompt_token_ids) + s.sampling.max_tokens for s in base_specs)
    ref_over = (*REFERENCE, "engine.block_size=16", f"engine.num_blocks={len(base_specs) * big}")
    base = {s.id: s.output_token_ids for s in serve(tiny, ref_over, base_specs, 10**6).seqs}

    specs, expected = [], {}
    for i, w in enumerate(workload):
        rid = f"r{i}"
        stop: tuple[int, ...] = ()
        first = sample_specs(w.spec(rid))[0].id
        if w.wants_stop:
            stop = (base[first][data.draw(st.integers(0, len(base[first]) - 1), label="stop at")],)
        spec = w.spec(rid, stop)
        specs.append(spec)
        eos = {tok.eos_token_id} if not w.ignore_eos else set()
        for sample in sample_specs(spec):
            expected[sample.id] = cut_at_stop(base[sample.id], set(stop) | eos)

    combo = data.draw(policies(schedulers), label="policies")
    chunked = "scheduler=chunked" in combo
    sizes = [len(s.prompt_token_ids) + s.sampling.max_tokens for s in specs]
    limits = data.draw(engines(sizes, chunked), label="engine")
    note(f"python run.py model=tiny {' '.join(combo + limits)}")
    samples = [x for spec in specs for x in sample_specs(spec)]
    res = serve(tiny, combo + limits, specs, step_bound(samples, chunked))  # end check inside

    s = summarize(res)
    assert s["requests_finished"] == len(samples) and s["requests_rejected"] == 0
    assert s["deferred_tokens"] == s["tokens_kept"] + s["overshoot_tokens"]
    assert all(st_.held_steps <= st_.window for st_ in res.steps)
    if chunked:  # every prefill token counted once per (re)computation, in its chunks
        assert s["prefill_tokens"] == sum(st_.prefill_tokens for st_ in res.steps)
        assert s["prefill_chunks"] >= sum(1 for q in res.seqs) + s["preemptions"]
    if "output=deferred" in combo:
        window = int(combo[-1].split("=")[1])
        assert max(st_.held_steps for st_ in res.steps) <= window
    for seq in res.seqs:
        out, want = seq.output_token_ids, expected[seq.id]
        if seq.sampling.greedy:
            if check_same_greedy(model, seq.spec.prompt_token_ids, seq.id, out, want):
                continue  # a genuine fp32 tie: the continuation after it may differ
        else:
            assert out == want, f"{seq.id}: seeded sampling gave other tokens"
        stops = seq.stop_ids
        if seq.finish_reason == "length":
            assert len(out) == seq.sampling.max_tokens and not stops & set(out)
        else:
            assert seq.finish_reason == "stop" and out[-1] in stops
            assert not stops & set(out[:-1]), f"{seq.id} went past its first stop token"
        if not chunked:  # a chunked prefill may be preempted before its first token
            assert seq.preemptions <= max(0, len(out) - 1), f"{seq.id} preempted w/o progress"
    assert s["max_preemptions_per_request"] == max(q.preemptions for q in res.seqs)


@settings(max_examples=15)
@given(data=st.data())
def test_beam_search_finds_the_same_beams_under_any_policy(tiny: Any, data: Any) -> None:
    """Beam searches of widths 2-3 (stop tokens drawn) under any policy but static batches
    (whose rows wait for each other: a beam's siblings never join it) and a pool that holds
    every beam of the largest request: the beams of one unhurried run."""
    _, tok = tiny
    size = data.draw(st.integers(1, 3), label="requests")
    specs = []
    for i in range(size):
        prompt = data.draw(st.lists(st.integers(3, len(tok) - 1), min_size=1, max_size=30))
        width = data.draw(st.integers(2, 3))
        stop = data.draw(st.sampled_from([(), (int(prompt[0]),)]))
        sampling = SamplingParams(
            max_tokens=data.draw(st.integers(1, 12)), beam_width=width, stop_token_ids=stop,
            ignore_eos=True, length_penalty=data.draw(st.sampled_from([0.0, 1.0])),
        )  # fmt: skip
        specs.append(RequestSpec(f"r{i}", prompt, sampling, arrival=data.draw(st.floats(0, 0.02))))
    beams = [s for spec in specs for s in sample_specs(spec)]
    big = max(len(s.prompt_token_ids) + s.sampling.max_tokens for s in beams)
    ref_over = ("engine.block_size=16", f"engine.num_blocks={len(beams) * big}")
    want = {s.id: s.output_token_ids for s in serve(tiny, ref_over, specs, 10**6).seqs}
    combo = data.draw(policies(tuple(s for s in SCHEDULERS if s != "static")), label="policies")
    chunked = "scheduler=chunked" in combo
    limits = list(data.draw(engines([big], chunked), label="engine"))
    bs = int(limits[0].split("=")[1])
    width = max(s.sampling.beam_width for s in specs)
    limits[1] = f"engine.num_blocks={width * (-(-big // bs) + 1)}"  # every beam, and a copy
    seqs = max(width, int(limits[2].split("=")[1]))
    limits[2] = f"engine.max_num_seqs={seqs}"
    limits[3] = f"engine.max_num_batched_tokens={max(seqs, int(limits[3].split('=')[1]))}"
    note(f"python run.py model=tiny {' '.join(combo + tuple(limits))}")
    res = serve(tiny, combo + tuple(limits), specs, 4 * step_bound(beams, chunked))
    assert {s.id: s.output_token_ids for s in res.seqs} == want
