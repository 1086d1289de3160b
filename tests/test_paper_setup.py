"""A paper's rules follow the model asked: a reproduction asked about another model computes
the rules the paper states as formulas for it (Sarathi-Serve's SLOs: 5x and 25x that model's
decode iteration of 32 requests at 4K tokens; its KV pool: the GPU's memory less that model's
weights), and its cells hold the paper's values beside them as the paper's set-up's, with no
deviation, instead of as targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from framework.run.compose import compose_cfg
from framework.run.paths import ROOT
from framework.studies.reproductions import (
    command,
    distserve_toy,
    mooncake_cache,
    sarathi_capacity,
    vllm_batching,
)
from framework.studies.reproductions.cells import Cell, PaperSetup
from framework.studies.reproductions.sarathi_capacity import SHAREGPT4, SLOS, kv_blocks

LLAMA_8B = ROOT / "framework" / "executors" / "simulated" / "models" / "llama-8b"
MISTRAL_7B = ROOT / "framework" / "executors" / "simulated" / "models" / "mistral-7b"


def test_cells_off_the_papers_set_up_hold_its_values_beside() -> None:
    paper = PaperSetup("M on G", {"model.path": str(MISTRAL_7B), "executor.hardware": "g"})
    here = OmegaConf.create({"model": {"path": str(MISTRAL_7B)}, "executor": {"hardware": "g"}})
    other = OmegaConf.create({"model": {"path": str(LLAMA_8B)}, "executor": {"hardware": "g"}})
    cells = [Cell("ratio", 2.6, 1.3, "x"), Cell("drawn", None, 4.0, "req/s")]
    assert paper.held_to(cells, here) == cells and not paper.differences(here)
    (moved, drawn) = paper.held_to(cells, other)
    assert paper.differences(other) == [f"model.path={LLAMA_8B} (the paper: {MISTRAL_7B})"]
    assert moved.published is None and moved.deviation is None and moved.relative is None
    assert moved.published_text() == "not published for this set-up (published for M on G: 2.6 x)"
    assert moved.to_json()["published_for"] == "M on G: 2.6 x"
    assert drawn == cells[1]


def test_the_kv_pool_follows_the_model_and_gpu() -> None:
    mistral = kv_blocks(MISTRAL_7B, "a100-80gb-pcie")
    assert kv_blocks(LLAMA_8B, "a100-80gb-pcie") < mistral  # more weights, more KV a token
    assert kv_blocks(MISTRAL_7B, "a100-40gb") < mistral
    assert kv_blocks(MISTRAL_7B, "a100-80gb-pcie", tp=2) > mistral


def quick(tmp: Path, name: str, *overrides: str) -> dict[str, Any]:
    argv = [name, "--quick", "--workers", "1", "--out", str(tmp), "observers=[]"]
    assert command.reproduce([*argv, f"mlflow.tracking_uri=sqlite:///{tmp / 'm.db'}", *overrides])
    return json.loads((tmp / "reproduction.json").read_text())


def test_sarathi_asked_about_another_model_computes_its_slos(tmp_path: Path) -> None:
    if not SHAREGPT4.is_file():
        pytest.skip("the ShareGPT-4 lengths are not beside the repository (../shared)")
    data = quick(tmp_path, "sarathi_capacity", f"model.path={LLAMA_8B}")["data"]
    decode_s = data["decode_iteration_ms"] / 1000
    assert not data["paper_setup"]
    assert data["slos"]["strict"]["tbt_p99_s"] == pytest.approx(5 * decode_s)
    assert data["slos"]["relaxed"]["tbt_p99_s"] == pytest.approx(25 * decode_s)
    assert data["slos"]["strict"]["tbt_p99_s"] != SLOS[0].tbt_p99_s
    assert data["kv_blocks"] == kv_blocks(LLAMA_8B, "a100-80gb-pcie")
    cells = json.loads((tmp_path / "reproduction.json").read_text())["cells"]
    ratio = next(c for c in cells if c["name"].startswith("strict SLO: Sarathi-Serve / vLLM"))
    assert ratio["published"] is None and ratio["deviation"] is None
    assert ratio["published_for"] == "Mistral-7B on one A100 80GB PCIe: 2.6 x"
    md = (tmp_path / "reproduction.md").read_text()
    assert "not published for this set-up" in md and "## The SLOs, for the model" in md


def test_the_kv_memory_follows_the_model_and_gpu_in_vllms_rule(tmp_path: Path) -> None:
    """Table 1's 12 GB on the paper's set-up; elsewhere the GPU's memory less the model's fp16
    weights and the rest Table 1 leaves, so more weights leave less, a larger GPU more."""
    paper = vllm_batching.kv_memory_mb()
    assert paper == vllm_batching.PAPER_KV_MB
    assert vllm_batching.kv_memory_mb(LLAMA_8B) > paper  # 16 GB of weights against 25.7
    assert vllm_batching.kv_memory_mb(hardware="a100-80gb") == paper + 40_000_000_000 // 2**20
    assert vllm_batching.kv_memory_mb(tp=2) > paper
    deep = json.loads((LLAMA_8B / "config.json").read_text()) | {"num_hidden_layers": 96}
    (tmp_path / "config.json").write_text(json.dumps(deep))  # about 22B: 44 GB of weights
    with pytest.raises(ValueError, match="leave no KV memory"):
        vllm_batching.kv_memory_mb(tmp_path, "a100-40gb")
    assert vllm_batching.kv_memory_mb(tmp_path, "a100-40gb", tp=2) > 0


@pytest.mark.parametrize("module", [vllm_batching, distserve_toy, sarathi_capacity, mooncake_cache])
def test_each_reproduction_knows_its_papers_set_up(module: Any) -> None:
    """On its own base config a reproduction is on the paper's set-up (its cells keep their
    targets); another GPU or parallelism moves it off, naming the key."""
    base = getattr(module, "BASE", None) or module.MACHINE
    assert module.PAPER.differences(compose_cfg(list(base))) == []
    other = compose_cfg([*base, "executor.hardware=h100-sxm", "executor.tensor_parallel=2"])
    moved = [d.split("=")[0] for d in module.PAPER.differences(other)]
    if module is mooncake_cache:  # a hit rate: the same on any model or GPU, not another block
        assert moved == []
        assert module.PAPER.differences(compose_cfg([*base, "engine.block_size=256"]))
    else:
        assert moved == ["executor.hardware", "executor.tensor_parallel"]


def test_on_the_papers_other_set_up_only_its_claims_for_every_model_are_targets() -> None:
    """Yi-34B on an NVLink pair is a set-up Sarathi-Serve's paper ran: its searches use the
    artifact's SLOs for it (0.2 and 1.0 s), the orderings the paper states for every model
    stay targets, and Mistral-7B's 2.6x is labelled as Mistral-7B's."""
    base = list(sarathi_capacity.MACHINE)
    yi = compose_cfg([*base, f"model.path={sarathi_capacity.YI_34B}", "executor.tensor_parallel=2"])
    assert sarathi_capacity.PAPER.which(yi) is sarathi_capacity.YI
    assert sarathi_capacity.PAPER.which(compose_cfg(base)) is sarathi_capacity.PAPER
    assert sarathi_capacity.PAPER.which(compose_cfg([*base, f"model.path={LLAMA_8B}"])) is None
    strict, relaxed = sarathi_capacity.slos(40.0, sarathi_capacity.YI)
    assert (strict.tbt_p99_s, relaxed.tbt_p99_s) == (0.2, 1.0)
    ratio = Cell("ratio", 2.6, 2.0, "x")
    order = Cell("order", 2, 2, "pairs", every_setup=True)
    moved, kept = sarathi_capacity.PAPER.held_to([ratio, order], yi)
    assert moved.published is None and moved.published_for.startswith("Mistral-7B")
    assert kept == order and kept.deviation == 0
    elsewhere = compose_cfg([*base, f"model.path={LLAMA_8B}"])
    assert sarathi_capacity.PAPER.held_to([order], elsewhere)[0].published is None
    assert sarathi_capacity.kv_blocks(sarathi_capacity.YI_34B, "a100-80gb-pcie", tp=2) > 0


def test_sglang_and_vllm_defaults_follow_the_model_and_gpus_asked() -> None:
    """Each engine's defaults in `sglang_offline` are its own rules computed for what was asked:
    the KV pool shrinks with the weights, grows with the GPUs; SGLang's rows are its request
    pool's size less one, vLLM's token budget the context bound; off the published set-up the
    cells hold the published numbers as the paper's, with no deviation."""
    from framework.studies.reproductions import sglang_offline as sg

    def rules(key: str, *extra: str) -> dict[str, dict[str, str]]:
        cfg = compose_cfg([*sg.BASE, *sg.setup_overrides(key), *extra])
        return {
            e: dict(o.split("=", 1) for o in rule(cfg) if o.startswith("engine."))
            for e, rule in sg.RULES.items()
        }

    paper, mistral = rules("8b"), rules("8b", f"model.path={MISTRAL_7B}")
    for engine in sg.RULES:
        assert int(mistral[engine]["engine.num_blocks"]) > int(paper[engine]["engine.num_blocks"])
    assert paper[sg.SGLANG]["engine.max_num_seqs"] == "2047"  # 131072 context: the pool's 2048
    assert mistral[sg.SGLANG]["engine.max_num_seqs"] == "4095"  # 32768 context: a pool of 4096
    assert rules("8b", "model.max_model_len=8192")[sg.VLLM]["engine.max_num_batched_tokens"] == (
        "8192"
    )
    tp = rules("8b", "executor.tensor_parallel=2")
    assert int(tp[sg.VLLM]["engine.num_blocks"]) > int(paper[sg.VLLM]["engine.num_blocks"])
    runs = {e: {"tok/s": 100.0} for e in sg.RULES}
    on = sg.cells_of("8b", runs, compose_cfg([*sg.BASE, *sg.setup_overrides("8b")]))
    off = sg.cells_of(
        "8b", runs, compose_cfg([*sg.BASE, *sg.setup_overrides("8b"), f"model.path={MISTRAL_7B}"])
    )
    assert [c.published for c in on] == [4281.51, 4132.37, round(4281.51 / 4132.37, 3)]
    assert all(c.published is None and c.paper_value is not None for c in off)
    assert off[0].published_for.startswith("Llama 3.1 8B on one A100-80GB")
