"""The Sarathi-Serve reproduction, quick form (`python -m experiments.reproduce
sarathi_capacity --quick`): its cells follow from its capacity searches, each search's
capacity is the highest rate whose probe met both conditions, the decode iteration costs at
least what its bytes take to stream, and at equal load Sarathi-Serve's 512-token budget keeps
the P99 time between tokens below vLLM's, whose prefills stall the decodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from framework.executors.simulated.gpu.hardware import load_hardware_spec
from framework.executors.simulated.gpu.model_shape import ModelShape
from framework.studies.reproductions import command
from framework.studies.reproductions.cells import Cell
from framework.studies.reproductions.sarathi_capacity import (
    DELAY_S,
    HARDWARE,
    MISTRAL_7B,
    PAPER_ORDER,
    QUICK,
    SHAREGPT4,
    SLOS,
    SYSTEMS,
)
from tests.helpers import assert_refused

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    if not SHAREGPT4.is_file():
        pytest.skip("the ShareGPT-4 lengths are not beside the repository (../shared)")
    out = tmp_path_factory.mktemp("sarathi")
    store = f"sqlite:///{out / 'mlflow.db'}"
    argv = ["sarathi_capacity", "--quick", "--workers", "1", "--out", str(out)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"]) == out
    return out, json.loads((out / "reproduction.json").read_text())


def test_quick_writes_its_report(quick: tuple[Path, dict[str, Any]]) -> None:
    out, data = quick
    assert (out / "reproduction.png").read_bytes()[:8] == PNG
    md = (out / "reproduction.md").read_text()
    assert md.startswith("# sarathi_capacity: Sarathi-Serve (OSDI 2024")
    for heading in ("## Set-up", "## Assumptions", "## Capacity, and what bounds it", "## Runs"):
        assert heading in md
    assert all(a["source"] for a in data["assumptions"])
    assert data["quick"] is True


def test_cells_follow_from_the_searches(quick: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick
    cells = {c["name"]: c for c in data["cells"]}
    capacity = data["data"]["capacity"]
    assert len(cells) == 6 + 2 + 2 + 1
    per_system = [c for c in cells.values() if c["name"].endswith(" capacity")]
    assert len(per_system) == 6
    for c in per_system:
        assert c["published"] is None and c["deviation"] is None and c["unit"] == "req/s"
    rates = {slo.name: {s: capacity[slo.name][s]["rate"] for s in SYSTEMS} for slo in SLOS}
    assert [c["simulated"] for c in per_system] == [rates[s.name][x] for s in SLOS for x in SYSTEMS]
    (strict,) = [c for c in cells.values() if "ratio" in c["name"] and "strict" in c["name"]]
    ratio = rates["strict"]["Sarathi-Serve"] / rates["strict"]["vLLM"]
    assert strict["published"] == 2.6 and strict["simulated"] == pytest.approx(ratio)
    assert strict["deviation"] == pytest.approx(ratio / 2.6 - 1)
    for slo, stated in PAPER_ORDER.items():
        (order,) = [c for c in cells.values() if c["name"].startswith(f"{slo} SLO: the paper")]
        kept = sum(rates[slo][a] > rates[slo][b] for a, b in stated)
        assert order["published"] == len(stated) and order["simulated"] == kept


def test_each_capacity_is_the_highest_rate_that_met_both_conditions(
    quick: tuple[Path, dict[str, Any]],
) -> None:
    _, data = quick
    for slo in SLOS:
        for system in SYSTEMS:
            found = data["data"]["capacity"][slo.name][system]
            probes = found["probes"]
            assert 1 <= len(probes) <= QUICK["probes"]
            for p in probes:
                met = p["scheduling_delay_p50_s"] <= DELAY_S and p["tbt_p99_s"] <= slo.tbt_p99_s
                assert p["passed"] == met and (p["missed"] == []) == met
            passed = [p["rate"] for p in probes if p["passed"]]
            assert found["rate"] == (max(passed) if passed else None)


def test_sarathi_serve_keeps_p99_tbt_below_vllm_at_the_same_rate(
    quick: tuple[Path, dict[str, Any]],
) -> None:
    _, data = quick
    same = data["data"]["same_rate"]["systems"]
    assert all(m["requests_finished"] == QUICK["requests"] for m in same.values())
    assert same["Sarathi-Serve (512)"]["tbt_p99_s"] < same["vLLM"]["tbt_p99_s"]
    # a 2,048-token budget stalls a decode longer than a 512-token one
    assert same["Sarathi-Serve (512)"]["tbt_p99_s"] < same["Sarathi-Serve (2048)"]["tbt_p99_s"]


def test_the_decode_iteration_costs_at_least_its_bytes(quick: tuple[Path, dict[str, Any]]) -> None:
    """32 rows at 4K context read the fp16 weights once and every row's K and V: no step
    can stream them faster than the card's bandwidth."""
    _, data = quick
    shape = ModelShape.from_config(json.loads((MISTRAL_7B / "config.json").read_text()))
    read = 2 * shape.total_params + 32 * 4096 * 2 * shape.kv_elements_per_token
    floor_ms = 1000 * read / float(load_hardware_spec(HARDWARE)["memory_bandwidth"])
    assert floor_ms <= data["data"]["decode_iteration_ms"] <= 2 * floor_ms


def test_a_cell_without_a_published_value_has_no_deviation() -> None:
    cell = Cell("capacity", None, 1.5, "req/s", source="drawn, not stated")
    assert cell.deviation is None and cell.relative is None and cell.published_text() == "-"
    assert cell.to_json()["published"] is None


def test_a_bad_override_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sarathi_capacity", "--quick", "--out", str(tmp_path), "engine.max_num_seqs=0"]
    assert_refused(command.main(argv), capsys.readouterr().err, "engine.max_num_seqs")
