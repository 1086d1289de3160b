"""Fig. 9 of the Mooncake paper as it draws it: the prefix cache's hit rate against its
capacity in tokens, on a log axis from 10^4 to 10^9, one curve per trace, with the published
numbers overlaid: Table 2's unbounded ratios at the right edge, and the text's "about 3M
tokens reach 41-75% of the largest hit rate, about 50M reach it" as a bar and a point (scaled
by the published largest rate). The offline LRU replay of each trace is drawn thin and
dashed, for reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.tracking.figures import plt, save_figure

COLORS = {"conversation": "tab:blue", "synthetic": "tab:orange"}
X_RANGE = (1e4, 1e9)


def draw(
    png: Path,
    series: dict[str, dict[str, Any]],
    table2: dict[str, float],
    at_3m: tuple[float, float],
    at_50m: float,
) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for trace, s in series.items():
        color = COLORS.get(trace, "tab:gray")
        xs = [p["capacity_tokens"] for p in s["curve"]]
        ax.plot(
            xs,
            [p["hit_rate"] for p in s["curve"]],
            "o-",
            color=color,
            label=f"{trace}: nanoserve's prefix cache",
        )
        ax.plot(
            xs,
            [p["replay_lru"] for p in s["curve"]],
            "--",
            color=color,
            alpha=0.45,
            linewidth=1,
            label=f"{trace}: offline LRU replay of hash ids",
        )
        ax.axhline(s["unbounded"]["hit_rate"], color=color, linestyle=":", linewidth=1)
        top = table2.get(trace)
        if top is None:
            continue
        ax.plot(
            [X_RANGE[1]],
            [top],
            "*",
            color=color,
            markersize=14,
            markeredgecolor="k",
            label=f"{trace}: published, Table 2 ({top:g}%)",
        )
        lo, hi = at_3m[0] * top / 100, at_3m[1] * top / 100
        ax.errorbar(
            [3e6],
            [(lo + hi) / 2],
            yerr=[[(hi - lo) / 2]],
            fmt="none",
            ecolor=color,
            elinewidth=6,
            alpha=0.35,
            capsize=0,
        )
        ax.plot([5e7], [at_50m * top / 100], "D", color=color, markeredgecolor="k", markersize=7)
    ax.plot(
        [],
        [],
        color="gray",
        linewidth=6,
        alpha=0.35,
        label=f"published: {at_3m[0]:g}-{at_3m[1]:g}% of the largest at ~3M tokens",
    )
    ax.plot(
        [],
        [],
        "D",
        color="gray",
        markeredgecolor="k",
        label="published: the largest reached at ~50M tokens",
    )
    ax.set_xscale("log")
    ax.set_xlim(X_RANGE[0] / 1.5, X_RANGE[1] * 1.5)
    ax.set_ylim(0, 100)
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("prompt tokens found cached (%)")
    ax.set_title("Mooncake Fig. 9: prefix cache hit rate against capacity (dotted: unbounded)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    save_figure(fig, png)
