"""The vLLM paper's reproduction, quick form (`python -m experiments.reproduce vllm_batching
--quick`): its cells, and the relations that hold at any scale: Orca(Max) <= Orca(Pow2) <=
Orca(Oracle) <= vLLM in batched requests, external fragmentation under contiguous extents and
none under pages, no internal fragmentation under the oracle's reservation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from framework.studies.reproductions import command
from framework.studies.reproductions.vllm_batching import ORDER, SHAREGPT


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not SHAREGPT.is_file():
        pytest.skip("the ShareGPT lengths are not beside the repository (../shared)")
    out = tmp_path_factory.mktemp("vllm")
    store = f"sqlite:///{out / 'mlflow.db'}"
    argv = ["vllm_batching", "--quick", "--workers", "1", "--out", str(out)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"]) == out
    return json.loads((out / "reproduction.json").read_text())


def test_quick_cells_and_their_relations(quick: dict[str, Any]) -> None:
    cells = {c["name"]: c for c in quick["cells"]}
    assert len(cells) == 8 + 2 + 4 + 2  # Fig. 13, its two ratios, Fig. 2, Fig. 12's ratios
    assert all(c["published"] > 0 for c in cells.values())
    runs = quick["data"]["runs"]
    for key in ("sharegpt", "alpaca_cv1"):
        rows = [runs[key][s]["mean_batched"] for s in ORDER]
        assert rows == sorted(rows), (key, rows)  # Max <= Pow2 <= Oracle <= vLLM
        assert runs[key]["vLLM"]["kv_share_external"] == 0
        for system in ORDER[:3]:
            assert runs[key][system]["kv_share_external"] > 0
        assert runs[key]["Orca (Oracle)"]["kv_share_internal"] == 0
        assert (
            runs[key]["Orca (Max)"]["kv_share_internal"]
            > runs[key]["Orca (Pow2)"]["kv_share_internal"]
        )
    for system in ORDER:
        assert runs["sharegpt"][system]["requests_finished"] == 100
