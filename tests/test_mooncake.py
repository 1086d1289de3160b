"""The Mooncake trace workload: shared prefixes from hash ids, arrivals, forced lengths, bad
lines refused with their line number, and a short simulated run that hits the prefix cache.

Traces are small JSONL files written here; one test reads the head of the published trace
when it is beside the repo (../shared/data/traces).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.executors.model_loader import load_tokenizer
from framework.workloads import build_workload
from tests.helpers import assert_refused, cli

REPO = Path(__file__).resolve().parents[1]
REAL_TRACE = REPO.parent / "shared" / "data" / "traces" / "mooncake_conversation.jsonl"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    """The tiny model's tokenizer (SmolLM2's): its vocabulary is the one runs use."""
    return load_tokenizer("tiny", None, None)


def row(ts: Any, inp: Any, out: Any, hash_ids: Any) -> dict[str, Any]:
    """One line of the format (typed loosely, so that tests can write malformed ones)."""
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": hash_ids}


def write(path: Path, lines: list[Any]) -> Path:
    """One line per item: dicts as JSON, strings as they are (for malformed lines)."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def mooncake(path: Path, **fields: Any) -> dict[str, Any]:
    return {"kind": "mooncake", "path": str(path), **fields}


def by_id(specs: list[RequestSpec]) -> dict[str, RequestSpec]:
    return {s.id: s for s in specs}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading entries `a` and `b` have in common."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


# --- prompts from hash ids ------------------------------------------------------------------


def test_shared_hash_ids_give_exactly_the_shared_token_prefix(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    bt = 8
    hash_lists = [[1, 2, 3], [1, 2, 4], [1, 5], [3], [6, 2, 3], [1, 2, 3, 7]]
    path = write(tmp_path / "t.jsonl", [row(0, len(h) * bt, 1, h) for h in hash_lists])
    specs = by_id(build_workload(mooncake(path, block_tokens=bt), tokenizer))
    ids = [specs[f"r{i}"].prompt_token_ids for i in range(len(hash_lists))]
    for (i, a), (j, b) in itertools.combinations(enumerate(hash_lists), 2):
        shared = common_prefix(a, b)  # leading hash ids in common
        expected = min(shared * bt, len(ids[i]), len(ids[j]))
        assert common_prefix(ids[i], ids[j]) == expected, (a, b)
        if shared < min(len(a), len(b)):  # the next block differs from its first token on
            assert ids[i][shared * bt] != ids[j][shared * bt]
    # A block depends on its hash id alone, not on its position or its request.
    assert ids[3] == ids[0][2 * bt : 3 * bt]
    assert ids[4][bt:] == ids[0][bt:]

    # Ordinary vocabulary only: no special or added token (EOS, BOS, chat markers).
    excluded = {*tokenizer.all_special_ids, *tokenizer.added_tokens_decoder}
    every = {t for p in ids for t in p}
    assert not every & excluded and max(every) < len(tokenizer)

    # The same seed gives the same prompts; another seed, other blocks.
    again = build_workload(mooncake(path, block_tokens=bt), tokenizer)
    assert [s.prompt_token_ids for s in again] == [s.prompt_token_ids for s in specs.values()]
    other = build_workload(mooncake(path, block_tokens=bt, seed=1), tokenizer)
    assert other[0].prompt_token_ids[:bt] != ids[0][:bt]


def test_prompt_is_cut_or_extended_to_input_length(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    bt = 8
    path = write(
        tmp_path / "t.jsonl",
        [
            row(0, 8 * 2 + 3, 1, [1, 2, 3]),  # the last block cut to 3 tokens
            row(0, 5, 1, [1, 2, 3]),  # ids past the length are unused
            row(0, 8 + 4, 1, [1]),  # 4 tokens past the last named block
            row(0, 8 + 4, 1, [1]),  # the same line again: its own tail
            row(0, 6, 1, []),  # no hash ids: all tail
        ],
    )
    specs = by_id(build_workload(mooncake(path, block_tokens=bt), tokenizer))
    ids = [specs[f"r{i}"].prompt_token_ids for i in range(5)]
    assert [len(p) for p in ids] == [19, 5, 12, 12, 6]
    assert ids[1] == ids[0][:5] and ids[2][:bt] == ids[0][:bt]
    assert ids[2][bt:] != ids[3][bt:]  # tails are no one else's prefix
    assert ids[2][:bt] == ids[3][:bt]


# --- arrivals, slices, forced lengths -------------------------------------------------------


def test_arrivals_time_scale_start_and_limit(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    stamps = [1000, 1500, 1500, 4000, 10250]  # milliseconds
    lines: list[Any] = [row(ts, 4, 2, [i]) for i, ts in enumerate(stamps)]
    lines.insert(2, "")  # blank lines are skipped and not counted
    path = write(tmp_path / "t.jsonl", lines)

    def arrivals(**fields: Any) -> list[tuple[str, float]]:
        return [(s.id, s.arrival) for s in build_workload(mooncake(path, **fields), tokenizer)]

    # Seconds from the slice's first stamp: (1500 - 1000) / 1000 = 0.5, and so on.
    assert arrivals() == [("r0", 0.0), ("r1", 0.5), ("r2", 0.5), ("r3", 3.0), ("r4", 9.25)]
    # Lines 1-3 (stamps 1500, 1500, 4000), gaps doubled: 0, 0, 2 * 2.5.
    assert arrivals(start=1, limit=3, time_scale=2.0) == [("r0", 0.0), ("r1", 0.0), ("r2", 5.0)]
    assert arrivals(start=3, limit=None) == [("r0", 0.0), ("r1", 6.25)]
    assert arrivals(time_scale=0) == [(f"r{i}", 0.0) for i in range(5)]
    # A line's prompt is its own whatever the slice: line 3 is r3 whole, r0 from start=3.
    whole = by_id(build_workload(mooncake(path), tokenizer))
    sliced = by_id(build_workload(mooncake(path, start=3), tokenizer))
    assert sliced["r0"].prompt_token_ids == whole["r3"].prompt_token_ids


def test_outputs_forced_to_output_length_and_prompts_to_input_length(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    lines = [row(0, 700, 5, [0, 1]), row(10, 1, 0, [0]), row(20, 0, 300, [])]
    path = write(tmp_path / "t.jsonl", lines)
    specs = build_workload(mooncake(path, seed=4), tokenizer)
    # Lengths as recorded; an empty prompt or output becomes 1 token, as for `trace`.
    assert [len(s.prompt_token_ids) for s in specs] == [700, 1, 1]
    assert [s.sampling.max_tokens for s in specs] == [5, 1, 300]
    assert all(s.sampling.ignore_eos and s.sampling.greedy for s in specs)
    assert [s.sampling.seed for s in specs] == [4, 5, 6]
    capped = build_workload(
        mooncake(path, seed=4, max_prompt_tokens=600, max_output_tokens=100), tokenizer
    )
    assert [len(s.prompt_token_ids) for s in capped] == [600, 1, 1]
    assert [s.sampling.max_tokens for s in capped] == [5, 1, 100]
    assert capped[0].prompt_token_ids == specs[0].prompt_token_ids[:600]


# --- errors ---------------------------------------------------------------------------------

GOOD = row(0, 4, 2, [0])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", r"not valid JSON"),
        ("[1, 2]", r"each line must be a JSON object, got list"),
        ('{"timestamp": 0, "input_length": 4, "hash_ids": []}', r"missing key 'output_length'"),
        (row(0, -5, 2, [0]), r"input_length must be an integer >= 0, got -5"),
        (row(1.5, 4, 2, [0]), r"timestamp must be an integer >= 0, got 1\.5"),
        (row(0, 4, True, [0]), r"output_length must be an integer >= 0, got True"),
        (row(0, 4, 2, "0 1 2"), r"hash_ids must be a list of integers, got '0 1 2'"),
        (row(0, 4, 2, [0, "x"]), r"hash_ids\[1\] must be an integer >= 0, got 'x'"),
        (row(0, 4, 2, [0, -2]), r"hash_ids\[1\] must be an integer >= 0, got -2"),
    ],
)
def test_a_malformed_line_is_refused_with_its_file_and_line(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, bad: Any, message: str
) -> None:
    path = write(tmp_path / "t.jsonl", [GOOD, "", bad, GOOD])  # the bad one is line 3
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: {message}"):
        build_workload(mooncake(path), tokenizer)
    assert len(build_workload(mooncake(path, limit=1), tokenizer)) == 1  # outside the slice


def test_the_command_line_refuses_a_bad_line_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "t.jsonl", [GOOD, row(0, 4, -1, [0])])
    status, _, err = cli(capsys, "model=tiny", "workload=mooncake", f"workload.path={path}")
    assert_refused(status, err, f"{path}:2: output_length must be an integer >= 0, got -1")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"block_tokens": 0}, r"workload\.block_tokens must be >= 1; got 0"),
        ({"start": -1}, r"workload\.start must be >= 0"),
        ({"limit": 0}, r"workload\.limit must be >= 1"),
        ({"time_scale": -1}, r"workload\.time_scale must be >= 0"),
        ({"max_prompt_tokens": 0}, r"workload\.max_prompt_tokens must be >= 1"),
        ({"start": 5}, r"workload\.start=5: .* has no lines from there on"),
    ],
)
def test_config_errors_name_the_field(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, fields: dict[str, Any], message: str
) -> None:
    path = write(tmp_path / "t.jsonl", [GOOD])
    with pytest.raises(ValueError, match=message):
        build_workload({**mooncake(path), **fields}, tokenizer)


def test_path_is_required_and_must_exist(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    with pytest.raises(
        ValueError, match=r"workload\.path is required for workload kind 'mooncake'"
    ):
        build_workload({"kind": "mooncake"}, tokenizer)
    with pytest.raises(FileNotFoundError, match=r"Mooncake trace file not found: .*nope\.jsonl"):
        build_workload(mooncake(tmp_path / "nope.jsonl"), tokenizer)


# --- runs -----------------------------------------------------------------------------------


def test_a_simulated_run_hits_the_prefix_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 conversations of 5 turns, interleaved 100 ms apart: turn t's hash ids extend turn
    t-1's by one block, so each later turn finds its previous turn's prompt in the cache."""
    bt = 64
    lines = [
        row(100 * (4 * t + c), (t + 2) * bt - 10, 4, [100 * c + j for j in range(t + 2)])
        for t in range(5)
        for c in range(4)
    ]
    path = write(tmp_path / "t.jsonl", lines)
    run_dir = tmp_path / "run"
    status, _, err = cli(
        capsys,
        "model=tiny",
        "executor=simulated",
        "workload=mooncake",
        f"workload.path={path}",
        "workload.limit=20",
        f"workload.block_tokens={bt}",
        "allocator=prefix_cache",
        "engine.block_size=16",
        "observers=[console]",
        f"hydra.run.dir={run_dir}",
    )
    assert status == 0, err[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["requests"] == metrics["requests_finished"] == 20
    assert metrics["prefix_query_tokens"] == sum(line["input_length"] for line in lines)
    assert metrics["prefix_hit_rate"] > 0
    # Turn t >= 1 shares turn t-1's whole prompt, (t+1)*64 - 10 tokens; its full 16-token
    # blocks are (t+1)*64 - 16 tokens. Over turns 1-4 of 4 conversations:
    # 4 * (64 * (2+3+4+5) - 4 * 16) = 3328 (the pool is large enough that nothing is evicted).
    assert metrics["prefix_hit_tokens"] == 3328


def test_the_published_trace_head(tokenizer: PreTrainedTokenizerBase) -> None:
    if not REAL_TRACE.is_file():
        pytest.skip(f"{REAL_TRACE} is not present")
    lines = [json.loads(x) for x in itertools.islice(REAL_TRACE.open(), 50)]
    specs = by_id(build_workload(mooncake(REAL_TRACE, limit=50), tokenizer))
    assert len(specs) == 50
    for i, line in enumerate(lines):
        spec = specs[f"r{i}"]
        assert len(spec.prompt_token_ids) == line["input_length"]
        assert spec.sampling.max_tokens == max(1, line["output_length"])
        assert spec.arrival == pytest.approx((line["timestamp"] - lines[0]["timestamp"]) / 1000)
    # Lines 0 and 1 share their first hash id only ([0, 1, ...] and [0, 14, ...]).
    assert lines[0]["hash_ids"][:2] == [0, 1] and lines[1]["hash_ids"][:2] == [0, 14]
    assert common_prefix(specs["r0"].prompt_token_ids, specs["r1"].prompt_token_ids) == 512
