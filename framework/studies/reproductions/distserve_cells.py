"""The DistServe blog's numbers, and its cells: each published rate beside the simulated one."""

from __future__ import annotations

from framework.studies.reproductions.cells import Cell

# The blog's numbers (its text and Figure 6; shared/papers.md, section 1).
PUBLISHED = {
    "colocated_ttft": 3.0,
    "colocated_tpot": 1.6,
    "colocated_goodput": 1.6,
    "prefill_only": 5.6,
    "decode_only": 10.0,
    "p2d1_per_gpu": 3.3,
    "ratio": 2.1,
}
FIRST_TTFT = 2.3  # the colocated TTFT-limited rate in the post's first version


def cells(rates: dict[str, float | None]) -> list[Cell]:
    """The blog's numbers beside the simulated ones (req/s, per GPU where it says so)."""
    fig6 = "blog, Figure 6 and its text"
    rows = [
        (
            "colocated: TTFT-limited rate (P90 TTFT <= 0.4 s)",
            "colocated_ttft",
            "req/s",
            fig6,
            f"the post's first version and shared/papers.md: {FIRST_TTFT:g}",
        ),
        ("colocated: TPOT-limited rate (P90 TPOT <= 0.04 s)", "colocated_tpot", "req/s", fig6, ""),
        (
            "colocated: goodput per GPU (both P90 targets)",
            "colocated_goodput",
            "req/s",
            fig6,
            "min(TTFT-limited, TPOT-limited) in the blog; searched under both here",
        ),
        ("prefill-only GPU: rate within P90 TTFT", "prefill_only", "req/s", fig6, ""),
        ("decode-only GPU: rate within P90 TPOT", "decode_only", "req/s", fig6, ""),
        (
            "2P1D: goodput per GPU, searched on the 3-GPU cluster",
            "p2d1_per_gpu",
            "req/s",
            fig6,
            "both P90 targets, rate / 3",
        ),
        (
            "2P1D: goodput per GPU, min(2 x prefill-only, decode-only) / 3",
            "p2d1_computed",
            "req/s",
            fig6,
            "computed from the two rates as the blog does",
        ),
        (
            "2P1D / colocated goodput per GPU",
            "ratio",
            "x",
            "blog, 3.3 / 1.6 (text: 2x)",
            "the searched 2P1D over the searched colocated",
        ),
    ]
    published = {**PUBLISHED, "p2d1_computed": PUBLISHED["p2d1_per_gpu"]}
    return [
        Cell(name, published[key], rates.get(key), unit, source=source, note=note)
        for name, key, unit, source, note in rows
    ]
