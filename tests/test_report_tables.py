"""The one Markdown table format shared by sweep tables and reproduction reports: rows read by
column name, rows given in column order (prose headers, cells formatted beforehand), and a
reproduction's section built on it."""

from __future__ import annotations

import pytest

from framework.studies.reproductions.vllm_tables import memory_section
from framework.tracking.tables import markdown_table


def test_rows_read_by_column_name_keep_their_format() -> None:
    rows = [{"a": 1, "b": 0.123456, "c": "x"}, {"a": None, "c": 2.0}]
    assert markdown_table(rows, ["a", "b"]) == "| a | b |\n|---|---|\n| 1 | 0.1235 |\n| - | - |"


def test_rows_in_column_order_take_prose_headers_and_formatted_cells() -> None:
    rows = [["vLLM", "1.500", None, 2.0], {"rate (req/s)": 3.14159}]
    table = markdown_table(rows, ["system", "rate (req/s)", "search", "probes"])
    assert table.splitlines() == [
        "| system | rate (req/s) | search | probes |",
        "|---|---|---|---|",
        "| vLLM | 1.500 | - | 2 |",
        "| - | 3.142 | - | - |",
    ]


@pytest.mark.parametrize("row", [["only one"], ["a", "b", "c"], "ab"])
def test_a_row_of_the_wrong_length_is_an_error(row: list[str] | str) -> None:
    with pytest.raises(ValueError, match="2 values"):
        markdown_table([row], ["x", "y"])


def test_a_reproduction_section_is_the_shared_table() -> None:
    shares = {"states": 0.6, "reserved": 0.1, "internal": 0.05, "external": 0.0, "free": 0.25}
    runs = {"vLLM": {f"kv_share_{k}": v for k, v in shares.items()}}
    table = memory_section(runs, {"vLLM": 96.3}).split("\n\n")[-1]
    assert table.splitlines() == [
        "| system | states | reserved | internal | external | free | token states / not free "
        "| Fig. 2 |",
        "|---|---|---|---|---|---|---|---|",
        "| vLLM | 60.0% | 10.0% | 5.0% | 0.0% | 25.0% | 80.0% | 96.3% |",
    ]
