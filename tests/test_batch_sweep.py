"""The benchmark's batch-size sweep (`--batch-sweep`, `experiments/bench/batch_sweep.py`): it
runs on the tiny model, and the llama.cpp side's command line and the reading of its table
are checked with a stand-in `llama-batched-bench` (a script that prints a table in its
format), never a real build. No time is asserted."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from experiments.bench import benchmark
from experiments.bench.batch_sweep import batched_bench_command, parse_batched_bench, phase_seconds
from framework.core.step_stats import StepStats

# What llama-batched-bench prints (its README's sample, trimmed): a header line, then rows.
SAMPLE = """
main: n_kv_max = 2048, n_batch = 2048, n_ubatch = 512, flash_attn = 0, is_pp_shared = 0

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    128 |    1 |    256 |    0.108 |  1186.64 |    3.079 |    41.57 |    3.187 |    80.32 |
|   128 |    128 |    2 |    512 |    0.198 |  1295.19 |    5.029 |    50.90 |    5.227 |    97.95 |
"""

STAND_IN = r'''#!{python}
"""A stand-in llama-batched-bench: writes its argv, prints one row a batch size (-npl)."""
import json, sys
argv = sys.argv[1:]
open({log!r}, "a").write(json.dumps(argv) + "\n")
get = lambda flag: argv[argv.index(flag) + 1]
pp, tg = int(get("-npp")), int(get("-ntg"))
cols = ["PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"]
print("| " + " | ".join(cols) + " |")
print("|" + "---|" * len(cols))
for b in map(int, get("-npl").split(",")):
    cells = [pp, tg, b, b * (pp + tg), 0.5, b * pp / 0.5, 2.0, b * tg / 2.0, 2.5, 1]
    print("| " + " | ".join(map(str, cells)) + " |")
'''


def test_the_table_is_read_as_llama_batched_bench_writes_it() -> None:
    points = parse_batched_bench(SAMPLE)
    assert [(p.batch, p.prompt, p.gen) for p in points] == [(1, 128, 128), (2, 128, 128)]
    # speeds from the seconds, which the table rounds to the millisecond
    assert abs(points[1].tg_tps / 50.90 - 1) < 2e-3 and abs(points[0].pp_tps / 1186.64 - 1) < 5e-3


def test_the_phases_of_a_run_are_its_prompt_steps_then_its_decode_steps() -> None:
    def step(i: int, t: float, prefill: int, decode: int) -> StepStats:
        return StepStats(i, t, 2, 0, 0, prefill, 0, decode, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0)

    steps = [step(0, 0.5, 40, 0), step(1, 0.6, 0, 2), step(2, 0.8, 0, 2), step(3, 0.85, 0, 2)]
    pp, tg = phase_seconds(steps, 2)
    assert abs(pp - 0.5) < 1e-9 and abs(tg - 0.3) < 1e-9


def test_the_sweep_runs_both_sides_alternating(tmp_path: Path) -> None:
    log = tmp_path / "argv.jsonl"
    binary = tmp_path / "llama-batched-bench"
    binary.write_text(STAND_IN.format(python=sys.executable, log=str(log)))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    gguf = tmp_path / "model-f32.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "sweep"
    benchmark.main(
        ["--quick", "--batch-sweep", "1,2", "--sweep-prompt", "6", "--sweep-gen", "3",
         "--llama-batched-bench", str(binary), "--gguf", str(gguf), "--out", str(out),
         "engine.packed_linears=false", "engine.paged_kernel=false",
         "engine.argmax_kernel=false", "engine.layer_glue=false"]
    )  # fmt: skip
    rows = json.loads((out / "batch_sweep.json").read_text())["rows"]
    assert [(r["system"], r["batch"]) for r in rows] == [
        ("nanoserve", 1), ("llama.cpp", 1), ("nanoserve", 2), ("llama.cpp", 2)
    ]  # fmt: skip
    for r in rows:
        assert r["pp_s"] > 0 and r["tg_s"] > 0 and r["prompt"] == 6 and r["gen"] == 3
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[c.index("-npl") + 1] for c in calls] == ["1", "2"]  # one point a call
    assert (
        calls[0]
        == batched_bench_command(binary, gguf, [1], 6, 3, int(calls[0][calls[0].index("-t") + 1]))[
            1:
        ]
    )
    assert "| nanoserve | 2 | 6 | 3 |" in (out / "batch_sweep.md").read_text()
