"""Workload builders: exact lengths, presets, determinism, trace replay and error messages.

No model is loaded: a small byte-level BPE tokenizer is trained on the shipped corpus, which
is a real `PreTrainedTokenizerFast` (encode, decode, chat template) and takes well under a
second to build.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from framework.core.request import RequestSpec, SamplingParams
from framework.workloads import build_workload, register_workload_configs
from framework.workloads.chat import load_chat_prompts
from framework.workloads.text import corpus_text, corpus_token_ids
from tests.helpers import assert_refused, cli

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
TRACES = REPO.parent / "shared" / "data" / "traces"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<eos>"]


def _train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def raw_tokenizer() -> Tokenizer:
    return _train_tokenizer()


@pytest.fixture(scope="module")
def tokenizer(raw_tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A chat model's tokenizer: has a chat template."""
    tok = PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer, eos_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def base_tokenizer(raw_tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A base model's tokenizer: no chat template."""
    return PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer, eos_token="<eos>")


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_workload_configs(ConfigStore.instance())
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        yield


def compose_workload(name: str, *overrides: str) -> DictConfig:
    cfg = compose(overrides=[f"+workload={name}", *(f"workload.{o}" for o in overrides)])
    return cfg.workload


def fixed(**fields: Any) -> dict[str, Any]:
    return {"kind": "fixed", **fields}


def synthetic(**fields: Any) -> dict[str, Any]:
    # Short prompts keep the many-request tests fast; lengths are tested separately.
    base = {"kind": "synthetic", "prompt_len_dist": "fixed", "prompt_len_mean": 4}
    return {**base, **fields}


def write_trace(
    path: Path, rows: list[str], header: str = "TIMESTAMP,ContextTokens,GeneratedTokens"
) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


TRACE_ROWS = [
    "2023-11-16 18:15:46.0000000,10,3",
    "2023-11-16 18:15:47.5000000,20,0",
    "2023-11-16 18:15:48.0000000,300,40",
    "2023-11-16 18:15:50.0000000,0,7",
]


def trace(path: Path, **fields: Any) -> dict[str, Any]:
    return {"kind": "trace", "path": str(path), **fields}


def summary(specs: list[RequestSpec]) -> list[tuple[Any, ...]]:
    return [(s.id, s.prompt_token_ids, s.sampling, s.arrival) for s in specs]


# --- exact-length prompts -------------------------------------------------------------------


def test_fixed_prompts_have_exact_lengths_of_corpus_text(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    corpus = corpus_token_ids(tokenizer).tolist()
    lens = [1, 7, 100, 2 * len(corpus) + 3]  # the last wraps around the corpus twice
    specs = build_workload(fixed(prompt_lens=lens, output_lens=[5, 6, 7, 8]), tokenizer)
    assert [len(s.prompt_token_ids) for s in specs] == lens
    assert [s.sampling.max_tokens for s in specs] == [5, 6, 7, 8]
    assert all(s.sampling.ignore_eos and s.arrival == 0 for s in specs)
    assert [s.id for s in specs] == ["r0", "r1", "r2", "r3"]
    doubled = corpus * 4
    for s in specs:  # every prompt is a contiguous window of the (cyclic) corpus
        ids = s.prompt_token_ids
        starts = [i for i, t in enumerate(corpus) if t == ids[0]]
        assert any(doubled[i : i + len(ids)] == ids for i in starts)
        assert s.prompt == tokenizer.decode(ids)


def test_prompt_text_without_offsets_is_decoded(raw_tokenizer: Tokenizer) -> None:
    class NoOffsets(PreTrainedTokenizerFast):
        """Stands in for a slow tokenizer, which cannot report character offsets."""

        @property
        def is_fast(self) -> bool:
            return False

    tok = NoOffsets(tokenizer_object=raw_tokenizer)
    specs = build_workload(fixed(prompt_lens=[9, 40], output_lens=[1, 1]), tok)
    assert [len(s.prompt_token_ids) for s in specs] == [9, 40]
    assert all(s.prompt == tok.decode(s.prompt_token_ids) for s in specs)


def test_fixed_arrivals_sort_requests_and_keep_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = fixed(prompt_lens=[3, 3, 3], output_lens=[1, 2, 3], arrivals=[2.0, 0.5, 1.0])
    specs = build_workload(cfg, tokenizer)
    assert [(s.id, s.arrival, s.sampling.max_tokens) for s in specs] == [
        ("r1", 0.5, 2),
        ("r2", 1.0, 3),
        ("r0", 2.0, 1),
    ]


def test_fixed_priorities_follow_the_requests(tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = fixed(prompt_lens=[3, 3, 3], output_lens=[1, 1, 1], arrivals=[1.0, 0.0, 0.5])
    assert [s.priority for s in build_workload(cfg, tokenizer)] == [0, 0, 0]  # the default
    specs = build_workload({**cfg, "priorities": [2, -1, 0]}, tokenizer)
    assert [(s.id, s.priority) for s in specs] == [("r1", -1), ("r2", 0), ("r0", 2)]


def test_request_priority_must_be_an_integer() -> None:
    for bad in (1.5, "high", True):
        with pytest.raises(ValueError, match=r"request 'x': priority must be an integer"):
            RequestSpec("x", [1], priority=bad)  # type: ignore[arg-type]
    assert RequestSpec("x", [1]).priority == 0


def test_request_i_gets_seed_plus_i(tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = fixed(prompt_lens=[2] * 3, output_lens=[1] * 3, seed=10, temperature=0.7, top_k=5)
    specs = build_workload(cfg, tokenizer)
    assert [s.sampling.seed for s in specs] == [10, 11, 12]
    assert {(s.sampling.temperature, s.sampling.top_k, s.sampling.top_p) for s in specs} == {
        (0.7, 5, 1.0)
    }


def test_prompt_offsets_are_seeded(tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = fixed(prompt_lens=[16] * 4, output_lens=[1] * 4)
    first, again = build_workload(cfg, tokenizer), build_workload(cfg, tokenizer)
    other = build_workload({**cfg, "seed": 1}, tokenizer)
    assert [s.prompt_token_ids for s in first] == [s.prompt_token_ids for s in again]
    assert [s.prompt_token_ids for s in first] != [s.prompt_token_ids for s in other]
    assert len({tuple(s.prompt_token_ids) for s in first}) == 4  # requests differ


# --- presets through Hydra ------------------------------------------------------------------


@pytest.mark.usefixtures("hydra_conf")
def test_straggler_preset(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload(compose_workload("straggler"), tokenizer)
    assert len(specs) == 8
    assert all(s.arrival == 0 and len(s.prompt_token_ids) == 5 for s in specs)
    assert sorted(s.sampling.max_tokens for s in specs) == [4] * 7 + [32]
    assert specs[-1].id == "r7" and specs[-1].sampling.max_tokens == 32
    assert all(s.sampling.ignore_eos for s in specs)


@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("chat", "chat"),
        ("fixed", "fixed"),
        ("straggler", "fixed"),
        ("synthetic", "synthetic"),
        ("jsonl", "jsonl"),
        ("trace", "trace"),
        ("shared_prefix", "shared_prefix"),
        ("multiturn", "multiturn"),
    ],
)
def test_every_yaml_composes(name: str, kind: str, tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = compose_workload(name)
    assert cfg.kind == kind
    if kind in ("jsonl", "trace"):  # these need a file
        with pytest.raises(ValueError, match=r"workload\.path is required"):
            build_workload(cfg, tokenizer)
    else:
        assert build_workload(cfg, tokenizer)


@pytest.mark.usefixtures("hydra_conf")
def test_yaml_fields_are_validated_by_the_schema(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ConfigCompositionException, match=r"workload\.rate=fast") as info:
        compose_workload("synthetic", "rate=fast")
    assert "could not be converted to Float" in str(info.value.__cause__)
    # Hydra lets '+' add any key; building still rejects the misspelt field.
    cfg = compose(overrides=["+workload=chat", "+workload.max_tokenz=3"]).workload
    with pytest.raises(ValueError, match=r"workload\.max_tokenz is not a field"):
        build_workload(cfg, tokenizer)


@pytest.mark.usefixtures("hydra_conf")
def test_fixed_yaml_takes_priorities(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload(compose_workload("fixed", "priorities=[1,0,0,2]"), tokenizer)
    assert [s.priority for s in specs] == [1, 0, 0, 2]
    assert compose_workload("straggler").priorities is None  # presets inherit the default


@pytest.mark.usefixtures("hydra_conf")
def test_trace_yaml_with_path_override(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """The preset's defaults (whole slice, recorded gaps, no caps) read the overridden file."""
    csv_path = write_trace(tmp_path / "t.csv", TRACE_ROWS)
    cfg = compose_workload("trace", f"path={csv_path}")
    assert cfg.path == str(csv_path)
    specs = build_workload(cfg, tokenizer)
    # TRACE_ROWS by hand: gaps from 18:15:46.0; context 10, 20, 300, 0 -> 1;
    # output 3, 0 -> 1, 40, 7.
    assert [s.id for s in specs] == ["r0", "r1", "r2", "r3"]
    assert [s.arrival for s in specs] == [0.0, 1.5, 2.0, 4.0]
    assert [len(s.prompt_token_ids) for s in specs] == [10, 20, 300, 1]
    assert [s.sampling.max_tokens for s in specs] == [3, 1, 40, 7]
    assert all(s.sampling.ignore_eos and s.sampling.greedy for s in specs)
    assert [s.sampling.seed for s in specs] == [0, 1, 2, 3]
    # The same prompts as the builder makes from a plain config of that file alone.
    plain = build_workload(trace(csv_path), tokenizer)
    assert [s.prompt_token_ids for s in specs] == [s.prompt_token_ids for s in plain]
    # The preset's other fields reach the builder too: rows 1-2, gaps doubled, caps.
    sliced = build_workload(
        compose_workload(
            "trace",
            f"path={csv_path}",
            "start=1",
            "limit=2",
            "time_scale=2.0",
            "max_prompt_tokens=15",
            "max_output_tokens=30",
        ),
        tokenizer,
    )
    assert [(s.id, s.arrival) for s in sliced] == [("r0", 0.0), ("r1", 1.0)]
    assert [len(s.prompt_token_ids) for s in sliced] == [15, 15]
    assert [s.sampling.max_tokens for s in sliced] == [1, 30]


# --- chat -----------------------------------------------------------------------------------


def test_chat_applies_template(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload({"kind": "chat"}, tokenizer)
    prompts = load_chat_prompts()
    assert len(specs) == len(prompts) >= 12
    assert [s.prompt for s in specs] == prompts
    for s in specs:
        text = tokenizer.decode(s.prompt_token_ids)
        assert text == f"<|im_start|>user\n{s.prompt}<|im_end|>\n<|im_start|>assistant\n"
        assert s.sampling.max_tokens == 48 and not s.sampling.ignore_eos and s.arrival == 0
        assert all(isinstance(t, int) for t in s.prompt_token_ids)


def test_chat_without_template_and_limit(base_tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload({"kind": "chat", "limit": 3, "max_tokens": 8}, base_tokenizer)
    assert [s.id for s in specs] == ["r0", "r1", "r2"]
    assert [s.prompt_token_ids for s in specs] == [base_tokenizer.encode(s.prompt) for s in specs]


# --- jsonl ----------------------------------------------------------------------------------


def test_jsonl_lines_override_defaults(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "Tell me about rivers.", "max_tokens": 9, "arrival": 2.0},
        {},
        {
            "prompt": "The lighthouse",
            "max_tokens": 4,
            "chat": False,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 3,
            "seed": 99,
            "ignore_eos": True,
            "priority": -2,
        },
    ]
    path.write_text("\n".join(json.dumps(x) if x else "" for x in lines) + "\n")
    specs = build_workload({"kind": "jsonl", "path": str(path), "seed": 5}, tokenizer)
    assert [s.id for s in specs] == ["r1", "r0"]  # sorted by arrival
    plain, chat = specs
    assert plain.prompt_token_ids == tokenizer.encode("The lighthouse")
    assert plain.sampling == SamplingParams(
        temperature=0.5, top_p=0.9, top_k=3, seed=99, max_tokens=4, ignore_eos=True
    )
    assert tokenizer.decode(chat.prompt_token_ids).startswith("<|im_start|>user\nTell me")
    assert (chat.sampling.seed, chat.sampling.max_tokens, chat.arrival) == (5, 9, 2.0)
    assert (plain.priority, chat.priority) == (-2, 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"p\.jsonl:2: not valid JSON"),
        ('{"prompt": "hi"}', r"p\.jsonl:2: missing required key 'max_tokens'"),
        ('{"prompt": "hi", "max_token": 3}', r"p\.jsonl:2: unknown keys \['max_token'\]"),
        ('{"prompt": "hi", "max_tokens": "3"}', r"p\.jsonl:2: 'max_tokens' must be an integer"),
        ('{"prompt": "hi", "max_tokens": 0}', r"p\.jsonl:2: sampling\.max_tokens must be >= 1"),
        (
            '{"prompt": "hi", "max_tokens": 2, "chat": 1}',
            r"p\.jsonl:2: 'chat' must be true or false",
        ),
        ("[1, 2]", r"p\.jsonl:2: each line must be a JSON object"),
        ('{"prompt": "hi", "max_tokens": 2, "priority": 0.5}', r"'priority' must be an integer"),
        ('{"prompt": "hi", "max_tokens": 2, "priority": true}', r"'priority' must be an integer"),
    ],
)
def test_jsonl_errors_name_file_and_line(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, line: str, message: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok", "max_tokens": 2}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        build_workload({"kind": "jsonl", "path": str(path)}, tokenizer)


def test_jsonl_missing_file(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        build_workload({"kind": "jsonl", "path": str(tmp_path / "nope.jsonl")}, tokenizer)


# --- synthetic ------------------------------------------------------------------------------


def test_synthetic_is_seeded(tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = {"kind": "synthetic", "num_requests": 20, "arrival": "gamma"}
    first, again = build_workload(cfg, tokenizer), build_workload(cfg, tokenizer)
    other = build_workload({**cfg, "seed": 1}, tokenizer)
    assert summary(first) == summary(again)
    assert [s.arrival for s in first] != [s.arrival for s in other]
    assert [s.sampling.max_tokens for s in first] != [s.sampling.max_tokens for s in other]
    assert [len(s.prompt_token_ids) for s in first] != [len(s.prompt_token_ids) for s in other]


def test_poisson_arrivals_have_the_requested_rate(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload(synthetic(num_requests=2000, rate=10.0), tokenizer)
    arrivals = np.array([s.arrival for s in specs])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert (len(arrivals) - 1) / arrivals[-1] == pytest.approx(10.0, rel=0.1)
    assert all(s.sampling.ignore_eos for s in specs)


def test_gamma_gaps_have_the_requested_cv(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload(
        synthetic(num_requests=3000, arrival="gamma", rate=5.0, cv=3.0), tokenizer
    )
    gaps = np.diff([s.arrival for s in specs])
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.2)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.2)


def test_burst_sends_everyone_at_zero(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload(synthetic(num_requests=5, arrival="burst"), tokenizer)
    assert [s.arrival for s in specs] == [0.0] * 5
    assert [s.id for s in specs] == [f"r{i}" for i in range(5)]


@pytest.mark.parametrize("dist", ["fixed", "uniform", "lognormal"])
def test_length_distributions(dist: str, tokenizer: PreTrainedTokenizerFast) -> None:
    cfg = synthetic(
        num_requests=2000,
        output_len_dist=dist,
        output_len_mean=50,
        output_len_min=10,
        output_len_max=1000,
        output_len_cv=0.5,
    )
    lens = np.array([s.sampling.max_tokens for s in build_workload(cfg, tokenizer)])
    if dist == "fixed":
        assert set(lens) == {50}
    elif dist == "uniform":
        assert lens.min() >= 10 and lens.max() <= 1000
        assert lens.mean() == pytest.approx(505, rel=0.1)
    else:
        assert lens.min() >= 10 and lens.max() <= 1000
        assert lens.mean() == pytest.approx(50, rel=0.1)
        assert lens.std() / lens.mean() == pytest.approx(0.5, rel=0.2)


def test_synthetic_prompt_lengths_are_exact(tokenizer: PreTrainedTokenizerFast) -> None:
    specs = build_workload(synthetic(num_requests=10, prompt_len_mean=37), tokenizer)
    assert {len(s.prompt_token_ids) for s in specs} == {37}
    cfg = synthetic(num_requests=50, prompt_len_dist="uniform", prompt_len_min=1, prompt_len_max=64)
    lens = [len(s.prompt_token_ids) for s in build_workload(cfg, tokenizer)]
    assert min(lens) >= 1 and max(lens) <= 64 and len(set(lens)) > 10


# --- trace ----------------------------------------------------------------------------------


def test_trace_replay(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_trace(tmp_path / "t.csv", TRACE_ROWS)
    specs = build_workload(trace(path), tokenizer)
    assert [s.id for s in specs] == ["r0", "r1", "r2", "r3"]
    assert [s.arrival for s in specs] == [0.0, 1.5, 2.0, 4.0]
    assert [len(s.prompt_token_ids) for s in specs] == [10, 20, 300, 1]  # 0 tokens -> 1
    assert [s.sampling.max_tokens for s in specs] == [3, 1, 40, 7]  # 0 tokens -> 1
    assert all(s.sampling.ignore_eos for s in specs)


def test_trace_slice_time_scale_and_caps(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_trace(tmp_path / "t.csv", TRACE_ROWS)
    cfg = trace(path, start=1, limit=2, time_scale=0.5, max_prompt_tokens=25, max_output_tokens=30)
    specs = build_workload(cfg, tokenizer)
    assert [s.arrival for s in specs] == [0.0, 0.25]  # from the slice's first row, halved
    assert [len(s.prompt_token_ids) for s in specs] == [20, 25]
    assert [s.sampling.max_tokens for s in specs] == [1, 30]
    everything = build_workload(trace(path, start=2, limit=None, time_scale=0), tokenizer)
    assert [s.arrival for s in everything] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("rows", "header", "message"),
    [
        (
            TRACE_ROWS,
            "time,prompt,output",
            r"needs the columns TIMESTAMP, ContextTokens, GeneratedTokens; "
            r"found time, prompt, output",
        ),
        ([], "", r"found none \(empty file\)"),
        ([*TRACE_ROWS[:2], "2023-11-16 18:15:49,abc,3"], None, r"t\.csv:4: ContextTokens 'abc'"),
        (["yesterday,3,3"], None, r"t\.csv:2: TIMESTAMP 'yesterday' is not a date-time"),
        (["2023-11-16 18:15:49,3"], None, r"t\.csv:2: expected 3 fields"),
        (["2023-11-16 18:15:49,3,-2"], None, r"t\.csv:2: GeneratedTokens must be >= 0"),
    ],
)
def test_trace_file_errors(
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[str],
    header: str | None,
    message: str,
) -> None:
    if header is None:
        path = write_trace(tmp_path / "t.csv", rows)
    else:
        path = write_trace(tmp_path / "t.csv", rows, header=header)
    with pytest.raises(ValueError, match=message):
        build_workload(trace(path), tokenizer)


def test_trace_missing_file_and_empty_slice(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(FileNotFoundError, match=r"trace file not found: .*missing\.csv"):
        build_workload(trace(tmp_path / "missing.csv"), tokenizer)
    path = write_trace(tmp_path / "t.csv", TRACE_ROWS)
    with pytest.raises(ValueError, match=r"workload\.start=9: .* has no data rows"):
        build_workload(trace(path, start=9), tokenizer)


def test_real_azure_trace(tokenizer: PreTrainedTokenizerFast) -> None:
    path = TRACES / "azure_llm_2023_conv.csv"
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    specs = build_workload(trace(path, limit=50), tokenizer)
    assert len(specs) == 50
    assert specs[0].arrival == 0.0 and specs[1].arrival == pytest.approx(4.3145789)
    assert len(specs[0].prompt_token_ids) == 374 and specs[0].sampling.max_tokens == 44
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(specs))


# --- config errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {"kind": "batch"},
            r"workload\.kind must be one of chat, fixed, jsonl, mooncake, multiturn, "
            r"shared_prefix, synthetic, trace; got 'batch'",
        ),
        ({"kind": "chat", "max_tokenz": 3}, r"workload\.max_tokenz is not a field .* max_tokens"),
        ({"kind": "chat", "max_tokens": "many"}, r"workload\.max_tokens: Value 'many'"),
        ({"kind": "chat", "max_tokens": 0}, r"workload\.max_tokens must be >= 1; got 0"),
        ({"kind": "chat", "temperature": -1}, r"workload\.temperature must be >= 0"),
        ({"kind": "chat", "top_p": 0}, r"workload\.top_p must be in \(0, 1\]"),
        ({"kind": "trace"}, r"workload\.path is required for workload kind 'trace'"),
        (fixed(output_lens=[1]), r"workload\.prompt_lens is required"),
        (
            fixed(prompt_lens=[1, 2, 3], output_lens=[1, 2]),
            r"equal lengths; workload\.prompt_lens has 3, workload\.output_lens has 2",
        ),
        (
            fixed(prompt_lens=[1], output_lens=[1], arrivals=[0, 1]),
            r"workload\.prompt_lens has 1, workload\.output_lens has 1, workload\.arrivals has 2",
        ),
        (fixed(prompt_lens=[], output_lens=[]), r"workload\.prompt_lens must list at least one"),
        (
            fixed(prompt_lens=[4, 0], output_lens=[1, 1]),
            r"workload\.prompt_lens\[1\] must be >= 1; got 0",
        ),
        (fixed(prompt_lens=[4], output_lens=[0]), r"workload\.output_lens\[0\] must be >= 1"),
        (
            fixed(prompt_lens=[4], output_lens=[1], arrivals=[-1]),
            r"workload\.arrivals\[0\] must be >= 0",
        ),
        (
            fixed(prompt_lens=[1, 2], output_lens=[1, 1], priorities=[0]),
            r"workload\.output_lens has 2, workload\.priorities has 1",
        ),
        (
            fixed(prompt_lens=[1], output_lens=[1], priorities=["high"]),
            r"workload\.priorities\[0\]: Value 'high'",
        ),
        (
            synthetic(arrival="poison"),
            r"^workload\.arrival must be one of poisson, gamma, burst; got 'poison'$",
        ),
        (synthetic(rate=0), r"workload\.rate must be > 0; got 0"),
        (synthetic(arrival="gamma", cv=-1), r"workload\.cv must be > 0"),
        (synthetic(num_requests=0), r"workload\.num_requests must be >= 1; got 0"),
        (
            synthetic(prompt_len_dist="normal"),
            r"workload\.prompt_len_dist must be one of fixed, uniform, lognormal",
        ),
        (synthetic(output_len_min=0), r"workload\.output_len_min must be >= 1; got 0"),
        (
            synthetic(output_len_max=2),
            r"workload\.output_len_max must be >= workload\.output_len_min \(4\)",
        ),
        (synthetic(prompt_len_mean=0), r"workload\.prompt_len_mean must be >= 1"),
        (synthetic(output_len_cv=0), r"workload\.output_len_cv must be > 0"),
        (trace("x.csv", start=-1), r"workload\.start must be >= 0"),
        (trace("x.csv", limit=0), r"workload\.limit must be >= 1"),
        (trace("x.csv", time_scale=-2), r"workload\.time_scale must be >= 0"),
        (trace("x.csv", max_output_tokens=0), r"workload\.max_output_tokens must be >= 1"),
    ],
)
def test_config_errors_name_the_field(
    cfg: dict[str, Any], message: str, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(ValueError, match=message):
        build_workload(cfg, tokenizer)


def test_accepts_dataclass_and_dictconfig(tokenizer: PreTrainedTokenizerFast) -> None:
    from framework.workloads import FixedWorkloadConfig

    as_dataclass = FixedWorkloadConfig(prompt_lens=[3, 4], output_lens=[2, 2])
    as_dictconfig = OmegaConf.create(fixed(prompt_lens=[3, 4], output_lens=[2, 2]))
    assert summary(build_workload(as_dataclass, tokenizer)) == summary(
        build_workload(as_dictconfig, tokenizer)
    )


# --- shared_prefix and multiturn (SmolLM2's tokenizer: the vocabulary prefix caching sees) --


@pytest.fixture(scope="module")
def smol() -> PreTrainedTokenizerBase:
    from framework.executors.model_loader import load_tokenizer

    return load_tokenizer("tiny", None, None)  # SmolLM2's, as model=tiny uses it


def shared_prefix(**fields: Any) -> dict[str, Any]:
    base = {"kind": "shared_prefix", "num_prefixes": 3, "questions_per_prefix": 4}
    return {**base, "prefix_tokens": 48, "question_tokens": 8, **fields}


def multiturn(**fields: Any) -> dict[str, Any]:
    base = {"kind": "multiturn", "conversations": 3, "turns": 4, "system_tokens": 24}
    return {**base, "question_tokens": 8, "answer_tokens": 12, **fields}


@pytest.fixture
def own_hydra() -> Iterator[None]:
    """The CLI initialises Hydra itself, which it refuses to do while this module's
    `hydra_conf` holds it; set that aside for the test and put it back after."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


def by_id(specs: list[RequestSpec]) -> list[RequestSpec]:
    """The workload's own order (ids r0, r1, ...), undoing `build_workload`'s arrival sort."""
    return sorted(specs, key=lambda s: int(s.id[1:]))


def test_shared_prefix_requests_share_exactly_their_prefix(smol: PreTrainedTokenizerBase) -> None:
    specs = build_workload(shared_prefix(), smol)
    assert sorted(s.id for s in specs) == sorted(f"r{i}" for i in range(12))
    assert {len(s.prompt_token_ids) for s in specs} == {48 + 8}
    groups: dict[tuple[int, ...], list[RequestSpec]] = {}
    for s in specs:
        groups.setdefault(tuple(s.prompt_token_ids[:48]), []).append(s)
    assert sorted(len(g) for g in groups.values()) == [4, 4, 4]  # 3 prefixes, 4 requests each
    prefixes = list(groups)
    # Different prefixes differ from the first token on: no KV block is shared across them.
    assert len({p[0:16] for p in prefixes}) == 3
    assert len({tuple(s.prompt_token_ids[48:]) for s in specs}) == 12  # every question differs
    corpus = corpus_token_ids(smol).tolist()
    text = " ".join(map(str, corpus + corpus))  # windows wrap around the corpus
    assert all(" ".join(map(str, p)) in text for p in prefixes)  # windows of the real text
    assert all(s.arrival == 0.0 and s.sampling.ignore_eos for s in specs)
    assert all(s.sampling.max_tokens == 32 and s.sampling.seed == int(s.id[1:]) for s in specs)


def test_shared_prefix_is_seeded(smol: PreTrainedTokenizerBase) -> None:
    first, again = build_workload(shared_prefix(), smol), build_workload(shared_prefix(), smol)
    other = build_workload(shared_prefix(seed=1), smol)
    assert summary(first) == summary(again)
    assert [s.prompt_token_ids for s in first] != [s.prompt_token_ids for s in other]


def test_shared_prefix_order(smol: PreTrainedTokenizerBase) -> None:
    grouped = by_id(build_workload(shared_prefix(order="grouped"), smol))
    interleaved = by_id(build_workload(shared_prefix(), smol))
    runs = [tuple(s.prompt_token_ids[:48]) for s in grouped]
    assert [len(list(g)) for _, g in itertools.groupby(runs)] == [4, 4, 4]  # back to back
    mixed = [tuple(s.prompt_token_ids[:48]) for s in interleaved]
    assert len([k for k, _ in itertools.groupby(mixed)]) > 3  # the prefixes alternate
    # Only the order changes: the same prompts, from the same text streams.
    assert sorted(s.prompt_token_ids for s in grouped) == sorted(
        s.prompt_token_ids for s in interleaved
    )


def test_shared_prefix_poisson_arrivals(smol: PreTrainedTokenizerBase) -> None:
    cfg = shared_prefix(num_prefixes=4, questions_per_prefix=50, rate=10.0)
    specs = build_workload(cfg, smol)
    arrivals = np.array([s.arrival for s in specs])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) > 0)
    assert [s.id for s in specs] == [f"r{i}" for i in range(200)]  # arrive in workload order
    assert (len(arrivals) - 1) / arrivals[-1] == pytest.approx(10.0, rel=0.25)
    assert summary(build_workload(cfg, smol)) == summary(specs)
    other = build_workload({**cfg, "seed": 1}, smol)
    assert [s.arrival for s in other] != [s.arrival for s in specs]
    # The arrival stream is its own: the prompts are those of the same workload at t=0.
    at_zero = build_workload({**cfg, "rate": None}, smol)
    assert [s.prompt_token_ids for s in specs] == [s.prompt_token_ids for s in by_id(at_zero)]


def test_multiturn_turns_extend_the_previous_prompt(smol: PreTrainedTokenizerBase) -> None:
    specs = build_workload(multiturn(think_time_s=2.5), smol)
    assert len(specs) == 12
    ordered = by_id(specs)
    for conv in range(3):
        turns = ordered[conv * 4 : conv * 4 + 4]
        assert len(turns[0].prompt_token_ids) == 24 + 8
        for prev, cur in itertools.pairwise(turns):
            assert cur.prompt_token_ids[: len(prev.prompt_token_ids)] == prev.prompt_token_ids
            assert len(cur.prompt_token_ids) - len(prev.prompt_token_ids) == 12 + 8
        assert [t.arrival for t in turns] == [0.0, 2.5, 5.0, 7.5]
    openings = {tuple(s.prompt_token_ids[:24]) for s in specs}
    assert len(openings) == 3  # each conversation has its own system opening
    assert all(s.sampling.ignore_eos and s.sampling.seed == int(s.id[1:]) for s in specs)
    # Sorted by arrival: every conversation's turn 1 before any turn 2.
    assert [s.id for s in specs[:3]] == ["r0", "r4", "r8"]


def test_multiturn_is_seeded_and_starts_are_poisson(smol: PreTrainedTokenizerBase) -> None:
    cfg = multiturn(rate=0.5, think_time_s=1.0)
    first, again = build_workload(cfg, smol), build_workload(cfg, smol)
    other = build_workload({**cfg, "seed": 1}, smol)
    assert summary(first) == summary(again)
    assert [s.prompt_token_ids for s in by_id(first)] != [s.prompt_token_ids for s in by_id(other)]
    ordered = by_id(first)
    starts = [ordered[conv * 4].arrival for conv in range(3)]
    assert starts[0] == 0.0 and starts[1] > 0 and starts != [s.arrival for s in by_id(other)][::4]
    for conv in range(3):
        turns = ordered[conv * 4 : conv * 4 + 4]
        assert [t.arrival - starts[conv] for t in turns] == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert [s.arrival for s in first] == sorted(s.arrival for s in first)


@pytest.mark.parametrize("cfg", [shared_prefix(), multiturn(), multiturn(answer_tokens=0)])
def test_sizes_known_before_loading_match_the_built_requests(
    cfg: dict[str, Any], smol: PreTrainedTokenizerBase
) -> None:
    """The up-front fit check sees exactly the prompt + max_tokens the run will hold."""
    from framework.workloads import check_workload

    built = by_id(build_workload(cfg, smol))
    assert check_workload(cfg) == [len(s.prompt_token_ids) + s.sampling.max_tokens for s in built]


def test_too_few_distinct_windows_is_refused(smol: PreTrainedTokenizerBase) -> None:
    size = corpus_token_ids(smol).size
    with pytest.raises(ValueError, match=r"workload\.question_tokens: found only \d+ distinct"):
        build_workload(shared_prefix(num_prefixes=1, questions_per_prefix=size + 1), smol)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (shared_prefix(num_prefixes=0), r"workload\.num_prefixes must be >= 1; got 0"),
        (shared_prefix(questions_per_prefix=0), r"workload\.questions_per_prefix must be >= 1"),
        (shared_prefix(question_tokens=0), r"workload\.question_tokens must be >= 1; got 0"),
        (shared_prefix(max_tokens=0), r"workload\.max_tokens must be >= 1; got 0"),
        (
            shared_prefix(order="random"),
            r"workload\.order must be one of interleaved, grouped; got 'random'",
        ),
        (shared_prefix(rate=-1), r"workload\.rate must be > 0; got -1"),
        (multiturn(conversations=0), r"workload\.conversations must be >= 1; got 0"),
        (multiturn(system_tokens=0), r"workload\.system_tokens must be >= 1; got 0"),
        (multiturn(answer_tokens=-1), r"workload\.answer_tokens must be >= 0; got -1"),
        (multiturn(think_time_s=-0.5), r"workload\.think_time_s must be >= 0; got -0.5"),
        (multiturn(rate=0), r"workload\.rate must be > 0; got 0"),
        (multiturn(turns="many"), r"workload\.turns: Value 'many'"),
    ],
)
def test_prefix_workload_errors_name_the_field(
    cfg: dict[str, Any], message: str, smol: PreTrainedTokenizerBase
) -> None:
    from framework.workloads import check_workload

    with pytest.raises(ValueError, match=message):
        check_workload(cfg)  # before any model loads
    with pytest.raises(ValueError, match=message):
        build_workload(cfg, smol)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("workload=shared_prefix", "workload.prefix_tokens=0"), "workload.prefix_tokens"),
        (("workload=shared_prefix", "workload.order=sorted"), "workload.order"),
        (("workload=multiturn", "workload.turns=0"), "workload.turns"),
        (("workload=multiturn", "workload.think_time_s=-1"), "workload.think_time_s"),
    ],
)
@pytest.mark.usefixtures("own_hydra")
def test_prefix_workload_bad_input_is_refused_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], field: str
) -> None:
    status, _, err = cli(capsys, "model=tiny", *args, f"hydra.run.dir={tmp_path}")
    assert_refused(status, err, field)
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.usefixtures("own_hydra")
def test_shared_prefix_runs_end_to_end_on_the_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = cli(
        capsys,
        "model=tiny",
        "workload=shared_prefix",
        "workload.num_prefixes=2",
        "workload.questions_per_prefix=3",
        "workload.prefix_tokens=32",
        "workload.question_tokens=8",
        "workload.max_tokens=4",
        "observers=[console]",
        f"hydra.run.dir={tmp_path}",
    )
    assert status == 0, err[-3000:]
    outputs = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert {o["id"] for o in outputs} == {f"r{i}" for i in range(6)}
    assert all(len(o["prompt_token_ids"]) == 40 for o in outputs)
    assert all(len(o["output_token_ids"]) == 4 for o in outputs)
    assert len({tuple(o["prompt_token_ids"][:32]) for o in outputs}) == 2


# --- trace of lengths under generated arrivals ----------------------------------------------

ARXIV_HEADER = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"
# Prompt and output lengths as (prompt, output) pairs, the rows of both layouts below.
LENGTHS = [(12, 3), (40, 9), (7, 1), (25, 16), (3, 30)]


def write_lengths(path: Path, layout: str, lengths: list[tuple[int, int]] = LENGTHS) -> Path:
    """A CSV of `lengths` in the Azure layout (with timestamps a second apart) or the arXiv
    summarization one (lengths, their sum and their ratio)."""
    if layout == "azure":
        rows = [f"2023-11-16 18:15:{i:02d}.0000000,{p},{o}" for i, (p, o) in enumerate(lengths)]
        return write_trace(path, rows)
    return write_trace(path, [f"{p},{o},{p + o},{p / o}" for p, o in lengths], ARXIV_HEADER)


@pytest.mark.parametrize("layout", ["azure", "arxiv"])
def test_length_trace_reads_lengths_back_exactly(
    tmp_path: Path, layout: str, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_lengths(tmp_path / "t.csv", layout)
    specs = by_id(build_workload(trace(path, arrival="poisson", rate=2.0), tokenizer))
    assert [(len(s.prompt_token_ids), s.sampling.max_tokens) for s in specs] == LENGTHS
    assert all(s.sampling.ignore_eos for s in specs)  # outputs forced to the recorded length
    assert specs[0].arrival == 0.0
    # The slice and the caps work as for a recorded replay.
    sliced = by_id(
        build_workload(
            trace(path, arrival="poisson", rate=2.0, start=1, limit=3, max_prompt_tokens=30),
            tokenizer,
        )
    )
    assert [(len(s.prompt_token_ids), s.sampling.max_tokens) for s in sliced] == [
        (30, 9),
        (7, 1),
        (25, 16),
    ]


def test_length_trace_names_its_columns(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    rows = [f"{o},x,{p}" for p, o in LENGTHS]
    path = write_trace(tmp_path / "t.csv", rows, header="out,note,in")
    cfg = trace(path, arrival="burst", prompt_column="in", output_column="out")
    specs = by_id(build_workload(cfg, tokenizer))
    assert [(len(s.prompt_token_ids), s.sampling.max_tokens) for s in specs] == LENGTHS
    assert [s.arrival for s in specs] == [0.0] * len(LENGTHS)


def test_length_trace_arrivals_are_poisson_at_the_rate(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_lengths(tmp_path / "t.csv", "arxiv", [(4, 2)] * 2001)
    specs = build_workload(trace(path, arrival="poisson", rate=10.0, limit=None), tokenizer)
    arrivals = np.array([s.arrival for s in specs])
    gaps = np.diff(arrivals)
    assert arrivals[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # exponential: cv 1


def test_length_trace_is_reproducible_from_the_seed(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_lengths(tmp_path / "t.csv", "azure", LENGTHS * 4)
    cfg = trace(path, arrival="poisson", rate=3.0)
    first, again = by_id(build_workload(cfg, tokenizer)), by_id(build_workload(cfg, tokenizer))
    assert summary(first) == summary(again)
    other = by_id(build_workload({**cfg, "seed": 1}, tokenizer))
    assert [s.arrival for s in first] != [s.arrival for s in other]
    # Arrivals draw from a stream of their own: the prompts are the recorded replay's, and
    # another rate scales every gap of the same draw.
    recorded = by_id(build_workload(trace(path), tokenizer))
    assert [s.prompt_token_ids for s in first] == [s.prompt_token_ids for s in recorded]
    doubled = by_id(build_workload({**cfg, "rate": 6.0}, tokenizer))
    assert [2 * s.arrival for s in doubled] == pytest.approx([s.arrival for s in first])


def test_length_trace_gamma_arrivals(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_lengths(tmp_path / "t.csv", "arxiv", [(4, 2)] * 3000)
    cfg = trace(path, arrival="gamma", rate=5.0, cv=3.0, limit=None)
    gaps = np.diff([s.arrival for s in build_workload(cfg, tokenizer)])
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.2)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.2)


@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize(
    ("name", "file", "columns"),
    [
        ("azure_conv_poisson", "azure_llm_2023_conv.csv", ("ContextTokens", "GeneratedTokens")),
        (
            "arxiv_poisson",
            "arxiv_summarization_lengths.csv",
            ("num_prefill_tokens", "num_decode_tokens"),
        ),
    ],
)
def test_length_presets_serve_the_shared_traces(
    name: str, file: str, columns: tuple[str, str], tokenizer: PreTrainedTokenizerFast
) -> None:
    if not (TRACES / file).is_file():
        pytest.skip(f"{TRACES / file} is not present")
    cfg = compose_workload(name, f"path={TRACES / file}", "limit=30", "rate=5.0")
    assert cfg.kind == "trace" and cfg.arrival == "poisson"
    with (TRACES / file).open(newline="") as f:
        rows = list(itertools.islice(csv.DictReader(f), 30))
    expected = [(int(r[columns[0]]), int(r[columns[1]])) for r in rows]
    specs = by_id(build_workload(cfg, tokenizer))
    assert [(len(s.prompt_token_ids), s.sampling.max_tokens) for s in specs] == expected
    assert specs[0].arrival == 0.0 and len({s.arrival for s in specs}) == 30


@pytest.mark.parametrize(
    ("layout", "fields", "message"),
    [
        ("arxiv", {}, r"t\.csv: no TIMESTAMP column, so no recorded arrivals .*arrival=poisson"),
        ("arxiv", {"arrival": "poisson"}, r"workload\.rate is required for workload\.arrival"),
        ("azure", {"rate": 2.0}, r"workload\.rate=2\.0 applies to workload\.arrival=poisson"),
        (
            "azure",
            {"arrival": "poisson", "rate": 2.0, "time_scale": 0.5},
            r"workload\.time_scale=0\.5 scales recorded arrivals only",
        ),
        (
            "azure",
            {"arrival": "uniform"},
            r"workload\.arrival must be one of recorded, poisson, gamma, burst; got 'uniform'",
        ),
        ("azure", {"arrival": "poisson", "rate": 0}, r"workload\.rate must be > 0; got 0"),
        ("azure", {"arrival": "gamma", "rate": 1, "cv": 0}, r"workload\.cv must be > 0"),
        (
            "arxiv",
            {"arrival": "burst", "prompt_column": "num_prefill_tokens"},
            r"workload\.prompt_column is set but workload\.output_column is not",
        ),
        (
            "arxiv",
            {"arrival": "burst", "prompt_column": "in", "output_column": "num_decode_tokens"},
            r"workload\.prompt_column='in': .*t\.csv has no such column; found num_prefill",
        ),
    ],
)
def test_length_trace_errors_name_the_field(
    tmp_path: Path,
    layout: str,
    fields: dict[str, Any],
    message: str,
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    from framework.workloads import check_workload

    cfg = trace(write_lengths(tmp_path / "t.csv", layout), **fields)
    with pytest.raises(ValueError, match=message):
        check_workload(cfg)  # before any model loads
    with pytest.raises(ValueError, match=message):
        build_workload(cfg, tokenizer)


@pytest.mark.parametrize(
    ("header", "rows", "message"),
    [
        (ARXIV_HEADER, ["12,3,15,4.0", "40,x,40,0"], r"t\.csv:3: num_decode_tokens 'x' is not"),
        (ARXIV_HEADER, ["12,3,15,4.0", "40"], r"t\.csv:3: expected 4 fields \(num_prefill"),
        (ARXIV_HEADER, ["-1,3,2,0"], r"t\.csv:2: num_prefill_tokens must be >= 0, got -1"),
        ("prompt,output", ["1,2"], r"t\.csv: a trace needs the length columns ContextTokens"),
    ],
)
def test_length_trace_file_errors_name_the_line(
    tmp_path: Path, header: str, rows: list[str], message: str, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_trace(tmp_path / "t.csv", rows, header=header)
    with pytest.raises(ValueError, match=message):
        build_workload(trace(path, arrival="poisson", rate=1.0), tokenizer)


@pytest.mark.usefixtures("own_hydra")
def test_length_trace_bad_input_is_refused_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_lengths(tmp_path / "t.csv", "arxiv")
    args = ("model=tiny", "workload=trace", f"workload.path={path}", f"hydra.run.dir={tmp_path}")
    status, _, err = cli(capsys, *args)
    assert_refused(status, err, "no TIMESTAMP column")
    status, _, err = cli(capsys, *args, "workload.arrival=poisson", "workload.rate=-3")
    assert_refused(status, err, "workload.rate must be > 0")
    assert not (tmp_path / "metrics.json").exists()
