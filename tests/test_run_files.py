"""outputs.jsonl as a reader sees it, plain or gzipped, written here or by forked workers;
and a run folder's files found whichever way they were written."""

from __future__ import annotations

import gzip
import json
from array import array
from pathlib import Path

import pytest

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import Sequence
from framework.run import outputs_jsonl
from framework.run.outputs_jsonl import write_outputs
from framework.tracking.run_files import read_text, run_file


def requests(n: int) -> list[Sequence]:
    out = []
    for i in range(n):
        spec = RequestSpec(f"r{i}", array("i", range(i, 3 * i + 1)), SamplingParams(max_tokens=4))
        s = Sequence(spec, eos_token_id=None)
        s.output_token_ids = [i, i + 1]
        s.finish_reason = "length" if i % 3 else None
        s.reject_reason = None if i % 3 else "too long"
        out.append(s)
    return out


@pytest.mark.parametrize("parallel", [False, True], ids=["here", "forked workers"])
def test_outputs_read_back_the_same_plain_or_gzipped(
    tmp_path: Path, parallel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outputs_jsonl, "CHUNK_REQUESTS", 4)  # several members, the last short
    monkeypatch.setattr(outputs_jsonl, "PARALLEL_TOKENS", 0 if parallel else 10**12)
    seqs = requests(11)
    texts = {"r2": "two", "r5": 'quote " and\nnewline'}
    write_outputs(tmp_path / "outputs.jsonl", seqs, texts)
    (tmp_path / "gz").mkdir()
    write_outputs(tmp_path / "gz" / "outputs.jsonl.gz", seqs, texts)
    plain = (tmp_path / "outputs.jsonl").read_text()
    assert gzip.decompress((tmp_path / "gz" / "outputs.jsonl.gz").read_bytes()).decode() == plain
    assert read_text(run_file(tmp_path / "gz", "outputs.jsonl")) == plain
    lines = [json.loads(x) for x in plain.splitlines()]
    assert [x["id"] for x in lines] == [s.id for s in seqs]
    assert lines[5]["prompt_token_ids"] == list(range(5, 16)) and lines[5]["text"] == texts["r5"]
    assert lines[3]["finish_reason"] == "rejected" and lines[3]["reject_reason"] == "too long"
    assert lines[4]["output_token_ids"] == [4, 5] and lines[4]["finish_reason"] == "length"


def test_a_run_file_is_found_plain_or_gzipped(tmp_path: Path) -> None:
    assert run_file(tmp_path, "steps.csv") == tmp_path / "steps.csv"  # neither: the plain name
    (tmp_path / "steps.csv.gz").write_bytes(gzip.compress(b"a,b\r\n"))
    assert run_file(tmp_path, "steps.csv") == tmp_path / "steps.csv.gz"
    (tmp_path / "steps.csv").write_text("a\n")
    assert run_file(tmp_path, "steps.csv") == tmp_path / "steps.csv"
