"""Decode steps through static buffers per batch bucket (framework/executors/decode_graphs.py),
uncaptured on CPU (`engine.cuda_graphs=true`), against the eager step on the tiny model:

- greedy and seeded-sampled tokens equal eager's across buckets (padded and exact), output
  windows (immediate, deferred 1 and 4, adaptive), decode paths (the C++ kernel, gather +
  SDPA, flex_attention), preemption (recompute and swap) and prefix caching; decode steps
  are served from buckets, steps with a prefill row are not;
- padding rows write only the scratch block: every live block's K/V equals the eager run's;
- a staged step holds its rows' inputs (device-held tokens written into the ids buffer);
- one cache and one set of graphs per process: an engine built after another is collected
  borrows both; engines alive side by side get their own; a larger cache serves a smaller
  pool; nothing keeps a model alive;
- how the choice is made and said, and a bad setting named in one line.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.batch import HELD, Row, StepBatch
from framework.executors import cache_lease
from framework.executors.decode_graphs import DecodeGraphs, buckets, choose_graphs
from framework.executors.kernel_choice import Choice
from framework.executors.model_loader import TinySpec, load_model
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from framework.run.config_checks import check_engine
from tests.helpers import make_cfg, spec, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
# Kernels set, not measured (a measurement costs seconds a choice and is not under test).
FIXED = (
    "model=tiny",
    "engine.packed_linears=false",
    "engine.argmax_kernel=false",
    "engine.layer_glue=false",
    "engine.block_size=4",
    "engine.max_num_seqs=6",
    "model.max_model_len=128",
)


def workload() -> list[RequestSpec]:
    """Seven requests of staggered lengths, so decode steps run 1 to 6 rows (buckets 1, 2,
    4 padded, 6 exact), with one sampled row."""
    sampled = SamplingParams(temperature=0.9, top_k=30, top_p=0.9, seed=5, max_tokens=9)
    return [
        *(spec(i, [5 + i] * (3 + 2 * i), 4 + 3 * i, arrival=0.0) for i in range(6)),
        RequestSpec("s", [9] * 7, sampled, arrival=0.0),
    ]


def run(
    model: Any, tok: Any, graphs: bool, *overrides: str, specs: list[RequestSpec] | None = None
) -> tuple[Any, Any, Counter]:
    """(engine, result, rows of each bucket-served step by bucket size)."""
    cfg = make_cfg(*FIXED, f"engine.cuda_graphs={str(graphs).lower()}", *overrides)
    engine = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    used: Counter = Counter()
    g = engine.executor.graphs
    if g is not None:
        stage = g.stage

        def counted(batch: Any) -> Any:
            bucket, n = stage(batch)
            used[(bucket.inputs.size, n)] += 1
            return bucket, n

        g.stage = counted  # type: ignore[method-assign]
    result = engine.run(specs or workload(), tok.eos_token_id)
    if g is not None:
        del g.stage  # the lease's graphs outlive this engine: no wrapper left on them
    return engine, result, used


CASES = [
    ("output=immediate", "engine.paged_kernel=true"),
    ("output=deferred", "window=1", "engine.paged_kernel=false"),
    ("output=deferred", "window=4", "engine.paged_kernel=true"),
    ("output=adaptive", "engine.paged_kernel=false"),
    ("preemption=recompute", "engine.num_blocks=14", "output=deferred", "window=2"),
    ("preemption=recompute", "engine.num_blocks=12", "output=adaptive"),
    ("allocator=prefix_cache", "scheduler=chunked", "scheduler.chunk_size=5"),
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o))
def test_tokens_equal_eager(tiny: tuple[Any, Any], overrides: tuple[str, ...]) -> None:
    model, tok = tiny
    eager_engine, eager, _ = run(model, tok, False, *overrides)
    engine, graphed, used = run(model, tok, True, *overrides)
    assert tokens(graphed) == tokens(eager)
    assert all(len(s.output_token_ids) for s in graphed.seqs)
    # every step of decode rows alone (a one-token prefill chunk is a decode row: it may too)
    decode_steps = sum(1 for st in graphed.steps if st.prefill_rows == 0)
    assert engine.executor.graph_steps == sum(used.values()) >= decode_steps > 0
    assert any(size > n for size, n in used), used  # some step ran padded
    assert eager_engine.executor.graph_steps == 0 and eager_engine.executor.graphs is None
    assert engine.counters.preemptions == eager_engine.counters.preemptions
    if "preemption=recompute" in overrides:
        assert engine.counters.preemptions > 0


def test_flex_decode_through_buckets(tiny: tuple[Any, Any]) -> None:
    """flex_attention's plan made inside the bucket's forward from its buffers (as a
    captured graph recomputes it): eager flex on a CPU is dense and slow, so a short run."""
    model, tok = tiny
    specs = [spec(i, [5 + i] * (2 + i), 2 + 2 * i) for i in range(3)]
    flex = ("engine.flex_decode=true", "engine.num_blocks=16", "engine.max_num_seqs=4")
    _, eager, _ = run(model, tok, False, *flex, specs=specs)
    engine, graphed, used = run(model, tok, True, *flex, specs=specs)
    assert tokens(graphed) == tokens(eager)
    assert any(size > n for size, n in used) and engine.executor.graph_steps > 0


def test_padding_writes_only_the_scratch_block(tiny: tuple[Any, Any]) -> None:
    """The same run eager and through the buckets writes the same K/V to the same live
    slots, and no other live slot: the padding rows' writes land in the scratch block."""
    model, tok = tiny
    eager_engine, _, _ = run(model, tok, False, "engine.num_blocks=40")
    cfg = make_cfg(*FIXED, "engine.cuda_graphs=true", "engine.num_blocks=40")
    engine = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    live = 40 * 4  # the pool's slots; a lent cache may be larger, its scratch block last
    for layer in (*engine.executor.cache.k, *engine.executor.cache.v):
        layer[:live] = 7.0  # a lent cache's old values, made recognisable
    engine.run(workload(), tok.eos_token_id)
    assert engine.executor.graph_steps > 0
    old, new = eager_engine.executor.cache, engine.executor.cache
    for a, b in zip([*old.k, *old.v], [*new.k, *new.v], strict=True):
        written = a[:live].abs().sum((1, 2)) != 0  # what the eager run wrote (fresh zeros)
        assert written.any() and not written.all()
        torch.testing.assert_close(b[:live][written], a[:live][written], rtol=0, atol=1e-5)
        assert (b[:live][~written] == 7.0).all()  # untouched by any row, padding included


def test_a_staged_step_fills_its_bucket() -> None:
    """Three decode rows staged in the 4-row bucket: their ids (two still on the device,
    written there), positions, slots, lengths and tables (padded with the scratch block),
    then one padding row; prefill rows and wider batches are not a bucket's."""
    graphs = DecodeGraphs(lambda s: torch.zeros(s.size, 5), [1, 2, 4], 3, 4, 9, CPU)
    greedy = SamplingParams()
    rows = [
        Row("a", [HELD], 5, [21], [3, 5], 6, greedy, 1),
        Row("b", [42], 2, [2], [0], 3, greedy, 1),
        Row("c", [HELD], 9, [33], [7, 8, 1], 10, greedy, 1),
    ]
    on_device = torch.tensor([70, 71, 72])  # one per row; b's is not read
    bucket, n = graphs.stage(StepBatch(rows, on_device))
    static = bucket.inputs
    assert (n, static.size) == (3, 4)
    assert static.ids.tolist() == [[70, 42, 72, 0]]
    assert static.positions.tolist() == [[5, 2, 9, 0]]
    assert static.slots.tolist() == [21, 2, 33, 36]  # the scratch block's first slot
    assert static.lens.view(-1).tolist() == [6, 3, 10, 1]
    assert static.tables.tolist() == [[3, 5, 9], [0, 9, 9], [7, 8, 1], [9, 9, 9]]
    assert graphs.launch(bucket, n).shape == (3, 5)
    prefill = Row("p", [1, 2], 0, [0, 1], [0], 2, greedy, 0)
    assert not graphs.fits(StepBatch([rows[1], prefill]))
    assert not graphs.fits(StepBatch([rows[1]] * 5))
    assert graphs.fits(StepBatch(rows))


def test_capture_and_replay_with_a_stand_in_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA-only path, with torch.cuda's graph calls stood in for (no GPU here): each
    bucket, largest first, warmed up twice on a side stream, then captured into one shared
    pool; a staged step replays its bucket's graph and returns that graph's output rows."""
    from torch._dynamo import config as dynamo

    monkeypatch.setattr(dynamo, "cache_size_limit", dynamo.cache_size_limit)
    calls: list[tuple[Any, ...]] = []
    capturing: list[int] = []

    class Stream:
        def wait_stream(self, other: Any) -> None:
            calls.append(("wait_stream",))

    class Graph:
        def __init__(self) -> None:
            self.size = 0

        def replay(self) -> None:
            calls.append(("replay", self.size))

    class Capture:
        def __init__(self, graph: Graph, pool: Any = None) -> None:
            self.graph, self.pool = graph, pool

        def __enter__(self) -> None:
            capturing.append(1)

        def __exit__(self, *exc: Any) -> None:
            capturing.pop()

    def forward(static: Any) -> torch.Tensor:
        calls.append(("forward", static.size, bool(capturing)))
        return torch.full((static.size, 3), float(static.size))

    def graph(g: Graph, pool: Any = None) -> Capture:
        calls.append(("capture", pool))
        return Capture(g, pool)

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    graphs = DecodeGraphs(forward, [1, 2, 4], 3, 4, 9, CPU)  # a CPU: nothing captured yet
    assert not calls and all(b.graph is None for b in graphs.buckets.values())
    graphs._capture_all()
    expected: list[tuple[Any, ...]] = []
    for size in (4, 2, 1):
        expected += [("wait_stream",), ("forward", size, False), ("forward", size, False)]
        expected += [("wait_stream",), ("capture", "pool"), ("forward", size, True)]
    assert calls == expected
    for size, bucket in graphs.buckets.items():
        assert bucket.graph is not None and bucket.logits is not None
        bucket.graph.size = size
    greedy = SamplingParams()
    rows = [Row(f"r{i}", [5], 3, [40 + i], [10 + i], 4, greedy, 1) for i in range(3)]
    calls.clear()
    bucket, n = graphs.stage(StepBatch(rows))
    out = graphs.launch(bucket, n)
    assert calls == [("replay", 4)]  # the 4-row graph, not the forward
    assert out.shape == (3, 3) and (out == 4.0).all()


def test_buckets() -> None:
    assert buckets(1) == [1]
    assert buckets(3) == [1, 2, 3]
    assert buckets(8) == [1, 2, 4, 8]
    assert buckets(16) == [1, 2, 4, 8, 16]
    assert buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def test_one_cache_and_graphs_per_process(tiny: tuple[Any, Any]) -> None:
    """A collected engine's cache and graphs go to the next engine over the same model and
    geometry; one still alive keeps its own; a larger cache serves a smaller pool."""
    model, tok = tiny
    cfg = make_cfg(*FIXED, "engine.cuda_graphs=true", "engine.num_blocks=30")
    first = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    cache, graphs = first.executor.cache, first.executor.graphs
    alive = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    assert alive.executor.cache is not cache  # two engines side by side: two caches
    del first, alive
    gc.collect()
    smaller = make_cfg(*FIXED, "engine.cuda_graphs=true", "engine.num_blocks=20")
    again = build_engine(smaller, model, CPU, torch.float32, registry().pm.hook)
    assert again.executor.cache.num_blocks >= 30  # a lent cache at least as large
    assert again.executor.cache in {cache, *[x.cache for x in cache_lease.leases()]}
    if again.executor.cache is cache:
        assert again.executor.graphs is graphs  # captured once, borrowed
    result = again.run(workload(), tok.eos_token_id)  # a 20-block pool in a larger cache
    assert all(s.finish_reason for s in result.seqs)
    del again, result
    gc.collect()


def test_graphs_serve_any_engine_up_to_their_largest_bucket(tiny: tuple[Any, Any]) -> None:
    """Engines that differ in `max_num_seqs` (a calibration's points) borrow the lease's
    buckets while its largest holds their batches (padding into them); a larger one makes
    a new set, which the smaller then borrow too."""
    model, tok = tiny

    def graphs_of(seqs: int) -> Any:
        # blocks of 8: a cache geometry of this test's own, so no other test's lease serves
        own = ("engine.block_size=8", f"engine.max_num_seqs={seqs}")
        cfg = make_cfg(*FIXED, "engine.cuda_graphs=true", *own)
        engine = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
        graphs = engine.executor.graphs
        if seqs == 3:  # 3 rows at most, served by whatever buckets it borrowed
            assert tokens(engine.run(workload(), tok.eos_token_id)) == tokens(
                run(model, tok, False, *own)[1]
            )
        del engine
        gc.collect()
        return graphs

    six = graphs_of(6)
    assert graphs_of(3) is six  # 1, 2, 4, 6 hold any step of 3 rows
    twenty = graphs_of(20)
    assert twenty is not six and twenty.sizes == [1, 2, 4, 8, 16, 20]
    assert graphs_of(6) is twenty


def test_a_lease_does_not_keep_its_model_alive() -> None:
    model, _ = load_model("tiny", None, None, torch.float32, CPU, TinySpec())
    cfg = make_cfg(*FIXED, "engine.cuda_graphs=true", "engine.num_blocks=10")
    engine = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    lease = next(x for x in cache_lease.leases() if x.model() is model)
    del engine, model
    gc.collect()
    assert lease.model() is None


@pytest.mark.parametrize("how", ["default", "set"])
def test_a_failed_capture(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Under `auto` a capture that fails leaves the run eager, saying why; set to true, it
    is the run's error."""
    from framework.executors import decode_graphs, hf

    model, tok = tiny

    def failing(*args: Any) -> None:
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(hf, "DecodeGraphs", failing)
    chosen = Choice(True, how, "captured per batch bucket")
    monkeypatch.setattr(decode_graphs, "choose_graphs", lambda value, device: chosen)
    own = ("engine.block_size=2", "engine.num_blocks=80")  # no other test's lease: a capture
    cfg = make_cfg(*FIXED, *own)
    if how == "set":
        with pytest.raises(RuntimeError, match="stream is capturing"):
            build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
        return
    engine = build_engine(cfg, model, CPU, torch.float32, registry().pm.hook)
    assert engine.executor.graphs is None
    said = engine.executor.describe()["cuda_graphs"]
    assert said == (
        "off (unavailable: capture failed: operation not permitted when stream is capturing)"
    )
    result = engine.run(workload(), tok.eos_token_id)
    assert tokens(result) == tokens(run(model, tok, False, *own)[1])


def test_choice_and_setting() -> None:
    assert choose_graphs("auto", CPU).use is False
    assert choose_graphs("auto", torch.device("cuda")).said("on", "off").startswith("on (default")
    assert choose_graphs(True, CPU).said("on", "off") == (
        "on (set: static buffers, nothing captured on cpu)"
    )
    assert choose_graphs("false", torch.device("cuda")).use is False
    cfg = make_cfg("model=tiny", "engine.cuda_graphs=sometimes")
    with pytest.raises(ValueError, match=r"^engine.cuda_graphs must be auto .* got 'sometimes'"):
        check_engine(cfg.engine)


def test_graph_check_dry_run(tmp_path: Path) -> None:
    """`experiments.graph_check --dry-run`: the GPU script's every part runs through on a
    CPU (the tiny model, toy sizes) and writes its table; tokens equal, nothing would wait."""
    from experiments.device import graph_check

    assert graph_check.main(["--dry-run", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "graph_check.json").read_text())
    assert report["verdict"]["tokens"] and report["verdict"]["no_waits"]
    assert [r["batch"] for r in report["decode"]] == [1, 2, 4]
    assert all(r["graphs_ms"] > 0 and r["analytic_ms"] > 0 for r in report["decode"])
    assert [r["output"] for r in report["windows"]] == ["immediate", "window=1", "window=4"]
    assert report["tokens"]["graph_steps"]["window=4"] > 0
    assert "| batch | ctx | eager_ms |" in (tmp_path / "graph_check.md").read_text()
    assert (tmp_path / "sim_check" / "sim_check_gpu.md").is_file()  # sim_check's GPU mode
