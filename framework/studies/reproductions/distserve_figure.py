"""The DistServe blog's Figure 6 as it draws it: P90 TTFT and P90 TPOT against the request
rate for a colocated GPU (left), P90 TTFT for a GPU that only prefills and P90 TPOT for one
that only decodes (middle), the SLO's lines across, the published rates as stars on them.
A third column sets the goodput per GPU beside the published one, and the share of requests
meeting both targets (DistServe's attainment) against the rate per GPU. Solid: the analytic
cost model (the cells); dashed: DistServe's own fitted step costs (the diagnosis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from framework.tracking.figures import plt, save_figure

PANELS = (  # (row, column, layout, metric, target index, published key, title)
    (0, 0, "colocated", "ttft_p90_s", 0, "colocated_ttft", "colocated: P90 TTFT"),
    (1, 0, "colocated", "tpot_p90_s", 1, "colocated_tpot", "colocated: P90 TPOT"),
    (0, 1, "prefill_only", "ttft_p90_s", 0, "prefill_only", "prefill-only GPU: P90 TTFT"),
    (1, 1, "decode_only", "tpot_p90_s", 1, "decode_only", "decode-only GPU: P90 TPOT"),
)
COLORS = {"analytic": "tab:orange", "profiled": "tab:gray"}
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # 0.4, 10: not 4 x 10^-1


def _plain_log(ax: Any, axis: str) -> None:
    """A log axis labelled in plain numbers, its minor ticks unlabelled."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(PLAIN)
    target.set_minor_formatter(NullFormatter())


def _points(curve: list[dict[str, Any]], metric: str) -> tuple[list[float], list[float]]:
    pts = [(p["rate"], p[metric]) for p in curve if p.get(metric) is not None]
    return [r for r, _ in pts], [v for _, v in pts]


def draw(
    png: Path,
    analytic: dict[str, Any],
    profiled: dict[str, Any] | None,
    published: dict[str, float],
    first_ttft: float,
    targets: tuple[float, float],
) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    runs = {"analytic": analytic, "profiled": profiled}
    for row, col, layout, metric, t, key, title in PANELS:
        ax = axes[row][col]
        for name, result in runs.items():
            if result is None or layout not in result["curves"]:
                continue
            xs, ys = _points(result["curves"][layout], metric)
            found = result["searches"].get(key, {}).get("rate")
            style = "o-" if name == "analytic" else "s--"
            label = "nanoserve, analytic" if name == "analytic" else "nanoserve, DistServe's fits"
            ax.plot(xs, ys, style, color=COLORS[name], markersize=4, label=label)
            if found is not None:
                ax.axvline(found, color=COLORS[name], linestyle=":", linewidth=1)
        ax.axhline(
            targets[t], color="k", linestyle="--", linewidth=1, label=f"SLO {targets[t]:g} s"
        )
        ax.plot(
            [published[key]],
            [targets[t]],
            "*",
            color="tab:green",
            markersize=15,
            markeredgecolor="k",
            label=f"published: {published[key]:g} req/s",
        )
        if key == "colocated_ttft":
            ax.plot(
                [first_ttft],
                [targets[t]],
                "*",
                color="white",
                markersize=12,
                markeredgecolor="k",
                label=f"the post's first version: {first_ttft:g}",
            )
        ax.set_yscale("log")
        ax.set_xscale("log")
        _plain_log(ax, "x")
        _plain_log(ax, "y")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(metric.replace("_s", " (s)"))
        ax.set_title(title)
        ax.legend(fontsize=7)
    _goodput_bars(axes[0][2], analytic, profiled, published)
    _attainment(axes[1][2], analytic)
    save_figure(fig, png)


def _goodput_bars(
    ax: Any, analytic: dict[str, Any], profiled: dict[str, Any] | None, published: dict[str, float]
) -> None:
    keys = ("colocated_goodput", "p2d1_per_gpu", "p2d1_computed")
    labels = ("colocated", "2P1D\nsearched", "2P1D\nmin(2p, d)/3")
    pub = (published["colocated_goodput"], published["p2d1_per_gpu"], published["p2d1_per_gpu"])
    x = np.arange(len(keys))
    series = [("analytic", analytic)] + ([("profiled", profiled)] if profiled else [])
    width = 0.8 / len(series)
    for i, (name, result) in enumerate(series):
        values = [result["rates"].get(k) or 0.0 for k in keys]
        label = "nanoserve, analytic" if name == "analytic" else "nanoserve, DistServe's fits"
        ax.bar(
            x + (i - (len(series) - 1) / 2) * width, values, width, color=COLORS[name], label=label
        )
    ax.plot(x, pub, "*", color="tab:green", markersize=15, markeredgecolor="k", label="published")
    ax.set_xticks(x, labels)
    ax.set_ylabel("goodput per GPU (req/s)")
    ax.set_title("goodput per GPU, both P90 targets")
    ax.legend(fontsize=7)


def _attainment(ax: Any, analytic: dict[str, Any]) -> None:
    for layout, gpus, color in (("colocated", 1, "tab:orange"), ("p2d1", 3, "tab:blue")):
        xs, ys = _points(analytic["curves"][layout], "attainment")
        ax.plot(
            [r / gpus for r in xs],
            [100 * y for y in ys],
            "o-",
            color=color,
            markersize=4,
            label="colocated" if gpus == 1 else "2P1D",
        )
    ax.axhline(90, color="k", linestyle="--", linewidth=1, label="90% of requests")
    ax.set_xscale("log")
    _plain_log(ax, "x")
    ax.set_xlabel("request rate per GPU (req/s)")
    ax.set_ylabel("requests meeting both targets (%)")
    ax.set_title("DistServe's attainment (analytic)")
    ax.legend(fontsize=7)
