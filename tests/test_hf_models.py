"""model=hf: any local Hugging Face causal LM folder runs paged through its own modules.

Tiny random Llama, Qwen2 and Mistral (with a sliding window shorter than the sequences, so
the window really cuts) are saved to a folder, loaded by path, and must match `generate`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from framework.core.request import RequestSpec, SamplingParams
from framework.executors.model_loader import load_model
from framework.run.summary import summarize
from tests.helpers import (
    assert_refused,
    check_same_greedy,
    cli,
    hf_greedy,
    make_cfg,
    run_engine,
)

CPU = torch.device("cpu")

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 6}),
}


def save_random(family: str, tok, folder: Path) -> Path:
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        **SHAPE,
        **extra,
    )
    torch.manual_seed(1)
    model = model_cls(config)
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_local_model_folder_matches_generate(tiny, tmp_path: Path, family: str) -> None:
    _, tok = tiny
    folder = save_random(family, tok, tmp_path / family)
    model, tok2 = load_model("hf", str(folder), None, torch.float32, torch.device("cpu"))
    specs = [
        RequestSpec(
            f"r{i}",
            list(range(40 + 3 * i, 52 + 5 * i)),
            SamplingParams(max_tokens=14, ignore_eos=True),
        )
        for i in range(4)
    ]
    refs = {s.id: hf_greedy(model, s.prompt_token_ids, 14, None) for s in specs}
    for alloc in ("worst_case", "incremental"):
        cfg = make_cfg(
            "model=hf",
            f"model.path={folder}",
            f"allocator={alloc}",
            "engine.block_size=4",
            "engine.num_blocks=16",
        )
        res = run_engine(cfg, model, tok2, specs)
        for seq in res.seqs:
            check_same_greedy(
                model,
                seq.spec.prompt_token_ids,
                f"{family}/{alloc} {seq.id}",
                seq.output_token_ids,
                refs[seq.id],
            )


def test_missing_or_wrong_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model.path=.*no such directory"):
        load_model("hf", str(tmp_path / "nope"), None, torch.float32, torch.device("cpu"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_model("hf", str(tmp_path / "empty"), None, torch.float32, torch.device("cpu"))


def test_stop_token_ends_a_request_where_it_appears(tiny) -> None:
    model, tok = tiny
    prompt = list(range(60, 75))
    ref = hf_greedy(model, prompt, 20, None)
    stop = ref[7]
    cut = ref[: ref.index(stop) + 1]
    spec = RequestSpec(
        "r0", prompt, SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=(stop,))
    )
    res = run_engine(make_cfg("model=tiny"), model, tok, [spec])
    assert res.seqs[0].output_token_ids == cut
    assert res.seqs[0].finish_reason == "stop"


def test_bfloat16_runs_and_keeps_its_books(tiny) -> None:
    _, tok = tiny
    model, _ = load_model("tiny", None, None, torch.bfloat16, torch.device("cpu"))
    specs = [
        RequestSpec(f"r{i}", [5 + i, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
        for i in range(3)
    ]
    cfg = make_cfg("model=tiny", "dtype=bfloat16")
    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine

    engine = build_engine(cfg, model, torch.device("cpu"), torch.bfloat16, registry().pm.hook)
    res = engine.run(specs, tok.eos_token_id)
    assert summarize(res)["tokens_kept"] == 18
    assert engine.executor.cache.k[0].dtype == torch.bfloat16


def test_tie_tolerance_fits_the_dtype() -> None:
    """fp32: an absolute 1e-4; bf16 / fp16: four units in the last place of the position's
    largest logit (a bf16 logit between 16 and 32 is a multiple of 0.125)."""
    from framework.run.greedy_check import TIE, tie_tolerance

    assert tie_tolerance(torch.float32, 31.75) == TIE
    assert tie_tolerance(torch.bfloat16, 31.75) == 0.5
    assert tie_tolerance(torch.bfloat16, -40.0) == 1.0
    assert tie_tolerance(torch.float16, 20.0) == 4 * 2.0**-10 * 16
    assert tie_tolerance(torch.bfloat16, 0.0) > 0  # no log of zero


def test_random_weights_need_only_a_config_and_are_seeded(
    tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`model.random_weights=true`: a folder holding a config and a tokenizer, no weights
    (what a GPU machine that cannot fetch them gets): the shape runs, with the same weights
    every time, and a whole run completes from the command line."""
    _, tok = tiny
    folder = save_random("llama", tok, tmp_path / "llama")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    one, _ = load_model("hf", str(folder), None, torch.float32, CPU, random_weights=True)
    two, _ = load_model("hf", str(folder), None, torch.float32, CPU, random_weights=True)
    assert one.config.num_hidden_layers == SHAPE["num_hidden_layers"]
    for (name, a), (_, b) in zip(one.state_dict().items(), two.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    status, _, err = cli(
        capsys, "model=hf", f"model.path={folder}", "model.random_weights=true",
        "workload=straggler", "observers=[console]", f"hydra.run.dir={tmp_path}/run",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    assert (tmp_path / "run" / "metrics.json").is_file()
    status, _, err = cli(
        capsys, "model=tiny", "model.random_weights=true", f"hydra.run.dir={tmp_path}/bad"
    )
    assert_refused(status, err, "model.random_weights applies to model=hf")
