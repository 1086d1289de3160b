"""flex_attention over the KV blocks where they lie (framework/executors/flex_paged.py)
against today's paths, in fp32 on CPU (eager flex_attention):

- one step's attention, decode rows and prefill rows mixed, prepared by the executor's own
  `_paged`, equals today's (decode rows by gather + SDPA and by the C++ kernel, prefill rows
  one SDPA a row) within `ATOL` / `RTOL`, over hypothesis-drawn steps: block sizes, GQA
  ratios, sliding windows, ragged lengths, rows over cached context, blocks shared by rows as
  under prefix caching, each path alone and both together;
- the block masks list every block a query may read (what a compiled kernel visits);
- the tiny model's greedy tokens through the engine with both on equal today's, and no call
  inside a forward would make the host wait for a GPU;
- how each is chosen and said, and a bad setting named in one line.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch.nn.attention.flex_attention import create_mask

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.batch import Row, StepBatch
from framework.engine.kv_cache import KVCache
from framework.executors import flex_paged
from framework.executors import kernel_choice as kc
from framework.executors import paged_attention as paged_attention_module
from framework.executors.hf import HFExecutor
from framework.executors.kernels.paged_decode import why_not
from framework.executors.paged_attention import PagedBatch, paged_attention
from framework.executors.sync_watch import watched
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from framework.run.config_checks import check_engine
from tests.helpers import assert_refused, cli, make_cfg, run_engine
from tests.test_no_sync import workload

CPU = torch.device("cpu")
# fp32: the same products and sums as SDPA's and the kernel's, in other orders (the eager
# path's softmax runs over the whole pool, the masked slots adding exact zeros).
ATOL, RTOL = 2e-6, 1e-5


@functools.cache
def kernel_here() -> bool:
    """Whether the C++ decode kernel builds here (asked once, at the first test that needs it)."""
    return why_not(CPU, torch.float32, 8) is None


pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@dataclass
class Step:
    rows: list[Row]
    cache: KVCache
    heads: int
    window: int | None
    scale: float | None
    tile: int
    seed: int


@st.composite
def steps(draw: st.DrawFn) -> Step:
    """A step's rows on blocks drawn from one pool: decode rows, fresh prompts, and prompt
    chunks over cached context; a row may start with blocks of a shared prompt head."""
    bs = draw(st.sampled_from([1, 2, 4, 5, 16]))
    kv = draw(st.sampled_from([1, 2]))
    heads = kv * draw(st.sampled_from([1, 2, 3, 4]))
    dim = draw(st.sampled_from([8, 16]))
    kinds = st.sampled_from(["decode", "fresh", "cached"])
    specs = draw(
        st.lists(
            st.tuples(kinds, st.integers(1, 40), st.integers(1, 12), st.integers(0, 3)),
            min_size=1,
            max_size=5,
        )
    )
    rng = draw(st.randoms(use_true_random=False))
    shapes = []
    for kind, cached, q, share in specs:
        first = 0 if kind == "fresh" else cached
        q = 1 if kind == "decode" else max(q, 2) if kind == "cached" else q
        shapes.append((first, q, min(share, first // bs)))  # only whole cached blocks shared
    head = max(s for _, _, s in shapes)
    need = head + sum(-(-(f + q) // bs) - s for f, q, s in shapes)
    free = list(range(need + 2))
    rng.shuffle(free)
    prefix = [free.pop() for _ in range(head)]
    rows = []
    for i, (first, q, share) in enumerate(shapes):
        ctx = first + q
        table = prefix[:share] + [free.pop() for _ in range(-(-ctx // bs) - share)]
        slots = [table[p // bs] * bs + p % bs for p in range(first, ctx)]
        rows.append(Row(f"r{i}", [1] * q, first, slots, table, ctx, SamplingParams(), 0))
    cache = KVCache(1, need + 2, bs, kv, dim, torch.float32, CPU)
    return Step(
        rows=rows,
        cache=cache,
        heads=heads,
        window=draw(st.none() | st.integers(1, 24)),
        scale=draw(st.sampled_from([None, 0.3])),
        tile=draw(st.sampled_from([1, 4, 128])),
        seed=draw(st.integers(0, 2**16)),
    )


def prepared(step: Step, kernel: bool, flex_decode: bool, flex_prefill: bool) -> PagedBatch:
    """The step's `PagedBatch` as the executor prepares it (`HFExecutor._paged`), with
    `step.tile` queries a tile of the prefill block mask."""

    def choice(use: bool) -> kc.Choice:
        return kc.Choice(use, "set", "")

    executor = SimpleNamespace(
        cache=step.cache,
        device=CPU,
        kernel=kernel,
        flex_dec=choice(flex_decode),
        flex_pre=choice(flex_prefill),
    )
    before = flex_paged.Q_TILE
    flex_paged.Q_TILE = step.tile
    try:
        return HFExecutor._paged(executor, StepBatch(step.rows))[0]  # type: ignore[arg-type]
    finally:
        flex_paged.Q_TILE = before


def attend(
    step: Step, paged: PagedBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    module = SimpleNamespace(layer_idx=0)
    out, _ = paged_attention(module, q, k, v, None, step.scale, paged, step.window)  # type: ignore[arg-type]
    return out


@settings(max_examples=40, deadline=None)
@given(steps())
def test_flex_equals_todays_paths(step: Step) -> None:
    """Every path writes the step's K/V into the same slots (the same values each time),
    then attends; flex_attention's outputs equal gather + SDPA's, the C++ kernel's and the
    per-row prefill loop's, each flex path alone and both at once."""
    g = torch.Generator().manual_seed(step.seed)
    cache = step.cache
    cache.k[0].normal_(generator=g)
    cache.v[0].normal_(generator=g)
    tokens = sum(len(r.token_ids) for r in step.rows)
    kv, dim = cache.k[0].shape[1:]
    q = torch.randn(1, step.heads, tokens, dim, generator=g)
    k = torch.randn(1, kv, tokens, dim, generator=g)
    v = torch.randn(1, kv, tokens, dim, generator=g)
    today = attend(step, prepared(step, False, False, False), q, k, v)
    assert torch.isfinite(today).all()
    ways = {"both": (False, True, True), "decode": (False, True, False)}
    ways["prefill"] = (kernel_here(), False, True)
    refs = {"gather": today}
    if kernel_here():  # today's C++ decode kernel beside the per-row prefill loop
        refs["kernel"] = attend(step, prepared(step, True, False, False), q, k, v)
    for name, way in ways.items():
        got = attend(step, prepared(step, *way), q, k, v)
        for ref_name, ref in refs.items():
            torch.testing.assert_close(
                got, ref, atol=ATOL, rtol=RTOL, msg=lambda m, n=name, r=ref_name: f"{n}/{r}: {m}"
            )


def allowed_outside_listed(mask: Any, q_len: int, kv_len: int) -> int:
    """How many (query, slot) pairs the mask allows whose block its lists leave out."""
    b = mask.kv_num_blocks.shape[0]
    fine = create_mask(mask.mask_mod, b, 1, q_len, kv_len, device="cpu")
    qt, kt = mask.BLOCK_SIZE
    listed = mask.to_dense().bool()
    listed = listed.repeat_interleave(qt, 2)[:, :, :q_len].repeat_interleave(kt, 3)[..., :kv_len]
    return int((fine & ~listed).sum())


@settings(max_examples=25, deadline=None)
@given(steps())
def test_block_lists_hold_every_block_read(step: Step) -> None:
    """Eager flex_attention reads the masks element by element; a compiled kernel visits
    only the listed blocks, so each list must hold every block its queries may read. And
    each row's query sees exactly its own positions: as many as the row's context (the
    window's last ones on a sliding layer)."""
    paged = prepared(step, False, True, True)
    slots = step.cache.k[0].shape[0]
    decode = [r for r in step.rows if len(r.token_ids) == 1 and r.start_pos > 0]
    for window in {None, step.window}:
        if paged.flex_decode is not None:
            mask = paged.flex_decode.mask(window)
            assert allowed_outside_listed(mask, 1, slots) == 0
            seen = create_mask(mask.mask_mod, len(decode), 1, 1, slots, device="cpu")
            want = [min(r.ctx_len, window or r.ctx_len) for r in decode]
            assert seen.sum(-1).view(-1).tolist() == want
        if paged.flex_prefill is not None:
            mask = paged.flex_prefill.mask(window)
            t = paged.flex_prefill.row.numel()
            assert allowed_outside_listed(mask, t, slots) == 0


def test_engine_tokens_equal_todays_with_flex_on(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy tokens, token for token, with flex_attention serving decode and prefill rows
    and without, under continuous batching, prefix caching and chunked prefill (rows over
    cached context), and deferred output; each flex path ran."""
    model, tok = tiny
    calls: Counter[str] = Counter()
    for name in ("flex_decode", "flex_prefill"):
        real = getattr(paged_attention_module, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(paged_attention_module, name, counted)
    rng = random.Random(3)
    head = [rng.randrange(3, len(tok)) for _ in range(9)]
    specs = [
        RequestSpec(
            f"r{i}",
            head[: rng.randint(0, 9)]
            + [rng.randrange(3, len(tok)) for _ in range(rng.randint(1, 20))],
            SamplingParams(max_tokens=rng.randint(1, 16), ignore_eos=True),
        )
        for i in range(6)
    ]
    fixed = (
        "model=tiny",
        "engine.block_size=4",
        "engine.num_blocks=96",
        "engine.packed_linears=false",
        "engine.argmax_kernel=false",
        "engine.layer_glue=false",
        "engine.paged_kernel=false",
    )
    for policy in (
        ("scheduler=continuous", "allocator=prefix_cache"),
        ("scheduler=chunked", "scheduler.chunk_size=5", "output=deferred", "window=2"),
    ):
        runs = []
        for on in (False, True):
            calls.clear()
            flex = (f"engine.flex_decode={on}", f"engine.flex_prefill={on}")
            result = run_engine(make_cfg(*fixed, *policy, *flex), model, tok, specs)
            runs.append({s.id: list(s.output_token_ids) for s in result.seqs})
            layers = model.config.num_hidden_layers
            assert (calls["flex_decode"] >= layers and calls["flex_prefill"] >= layers) == on
        assert runs[0] == runs[1], policy
        assert sum(map(len, runs[0].values())) == sum(s.sampling.max_tokens for s in specs)


def test_no_step_waits_with_flex_on(tiny: tuple[Any, Any]) -> None:
    """tests/test_no_sync.py's watch, with flex_attention serving both kinds of rows."""
    # Compiled frames are cached per process: after other tests' scales (other head sizes,
    # 0.3) dynamo makes the scale a 0-dim host tensor read by `item` inside its graph. A run
    # has one model, one scale: start this one as a run starts.
    torch._dynamo.reset()
    model, tokenizer = tiny
    cfg = make_cfg(
        "model=tiny", "engine.block_size=4", "engine.max_num_seqs=3", "engine.num_blocks=64",
        "engine.packed_linears=false", "engine.argmax_kernel=false", "engine.layer_glue=false",
        "engine.flex_decode=true", "engine.flex_prefill=true", "allocator=prefix_cache",
        "scheduler=chunked", "scheduler.chunk_size=4", "output=deferred", "window=2",
    )  # fmt: skip
    engine = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    assert engine.executor.describe()["decode_attention"].startswith("flex_attention (set")
    forwards: list[list[str]] = []
    engine.executor.execute = watched(engine.executor.execute, forwards)
    work = workload()
    result = engine.run(work, tokenizer.eos_token_id)
    assert len(result.seqs) == len(work) and all(s.finish_reason for s in result.seqs)
    assert forwards and not any(forwards), forwards


def test_the_choice_by_device_and_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in kc.FLEX_KEYS:
        auto = kc.choose_flex("auto", key, CPU, 16)
        assert (auto.use, auto.how) == (False, "default") and "eager" in auto.why
        on = kc.choose_flex(True, key, CPU, 16)
        assert (on.use, on.how) == (True, "set") and "eager" in on.why
        assert kc.choose_flex("false", key, CPU, 16) == kc.Choice(False, "set", "")
        with pytest.raises(ValueError, match=rf"^engine.{key} must be auto \(flex_attention on"):
            kc.setting("sometimes", key)
    cuda = torch.device("cuda")
    monkeypatch.setattr(flex_paged, "why_not_compiled", lambda device: None)
    assert kc.choose_flex("auto", "flex_decode", cuda, 16) == kc.Choice(
        True, "default", "compiled; the CUDA path"
    )
    monkeypatch.setattr(flex_paged, "why_not_compiled", lambda device: "no Triton")
    assert kc.choose_flex("auto", "flex_prefill", cuda, 16) == kc.Choice(
        False, "unavailable", "no Triton"
    )
    cfg = make_cfg("engine.flex_prefill=maybe")
    with pytest.raises(ValueError, match=r"^engine.flex_prefill must be auto"):
        check_engine(cfg.engine)


def test_describe_says_what_ran(tiny: tuple[Any, Any]) -> None:
    model, _ = tiny
    fixed = (
        "model=tiny",
        "engine.num_blocks=16",
        "engine.packed_linears=false",
        "engine.argmax_kernel=false",
        "engine.layer_glue=false",
        "engine.paged_kernel=false",
    )
    said = build_engine(make_cfg(*fixed), model, CPU, torch.float32, registry().pm.hook)
    text = said.executor.describe()
    assert text["decode_attention"] == "gather_sdpa (set)"
    assert text["flex_decode"].startswith("off (default: on cpu flex_attention runs eager")
    assert text["prefill_attention"].startswith("sdpa_per_row (default: ")
    cfg = make_cfg(*fixed, "engine.flex_decode=true", "engine.flex_prefill=true")
    text = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook).executor.describe()
    assert text["decode_attention"].startswith("flex_attention (set: eager")
    assert text["prefill_attention"].startswith("flex_attention (set: eager")


def test_a_bad_setting_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for override in ("engine.flex_decode=maybe", "engine.flex_prefill=2"):
        key = override.split("=")[0]
        status, _, err = cli(
            capsys, "model=tiny", "workload=straggler", override, f"hydra.run.dir={tmp_path}"
        )
        assert_refused(status, err, f"{key} must be auto (flex_attention on CUDA")
