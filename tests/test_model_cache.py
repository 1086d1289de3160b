"""The dequantised SmolLM2 cache: prepared once, even when several processes start together
(a sweep's jobs, the test suite's workers), and never trusted half-written. The real GGUF
takes ~40 s to dequantise, so the dequantisation is replaced by a stand-in here."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from framework.executors import model_loader
from tests.helpers import Shared


def test_concurrent_starts_prepare_the_cache_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []

    def dequantise(target: Path) -> None:
        calls.append(time.perf_counter())
        time.sleep(0.2)  # long enough for every other start to reach the lock meanwhile
        target.mkdir()
        (target / "config.json").write_text("{}")
        (target / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(model_loader, "_dequantise_smollm2", dequantise)
    got: list[Path] = []
    starts = [
        threading.Thread(target=lambda: got.append(model_loader.prepare_smollm2(str(tmp_path))))
        for _ in range(4)
    ]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    assert len(calls) == 1
    assert got == [tmp_path / model_loader.SMOLLM2_CACHE_NAME] * 4


def test_a_half_written_cache_is_prepared_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / model_loader.SMOLLM2_CACHE_NAME
    target.mkdir()
    (target / "config.json").write_text("{}")  # no tokenizer.json: not finished
    prepared: list[Path] = []
    monkeypatch.setattr(model_loader, "_dequantise_smollm2", prepared.append)
    model_loader.prepare_smollm2(str(tmp_path))
    assert prepared == [target]


def test_shared_results_are_computed_once_for_every_worker(tmp_path: Path) -> None:
    """`tests.helpers.Shared`, as two xdist workers use it: the first computes, the second
    reads the same value (same types) without computing; alone, each call computes."""
    calls: list[int] = []

    def compute() -> dict[str, list[int]]:
        calls.append(1)
        return {"r0": [1, 2, 3]}

    first, second = Shared(tmp_path), Shared(tmp_path)
    assert first.get(["k", 1], compute) == {"r0": [1, 2, 3]}
    assert second.get(["k", 1], compute) == {"r0": [1, 2, 3]}
    assert len(calls) == 1
    assert second.get(["k", 2], compute) == {"r0": [1, 2, 3]} and len(calls) == 2  # another key
    alone = Shared(None)
    alone.get(["k", 1], compute)
    assert len(calls) == 3
