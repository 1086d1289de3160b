"""The vLLM paper's figures as it draws them, nanoserve's bars with the published values
overlaid as markers: Fig. 13 (mean batched requests, four systems, ShareGPT and Alpaca), Fig.
2 (the KV memory's shares, stacked, per system) and the sustainable rates behind Fig. 12."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from framework.tracking.figures import plt, save_figure

SHARES = ("states", "reserved", "internal", "external", "free")
COLORS = ("tab:green", "tab:olive", "tab:red", "tab:purple", "lightgray")


def draw(
    png: Path,
    table: dict[str, dict[str, dict[str, Any]]],
    capacity: dict[str, Any],
    fig13: dict[str, dict[str, float]],
    fig2: dict[str, float],
) -> None:
    systems = list(table["sharegpt"])
    x = np.arange(len(systems))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5))
    for ax, (trace, key, title) in zip(
        axes[:2],
        (
            ("sharegpt", "sharegpt", "ShareGPT, 2 req/s"),
            ("alpaca", "alpaca_cv1", "Alpaca, 30 req/s"),
        ),
        strict=True,
    ):
        ours = [table[key][s]["mean_batched"] for s in systems]
        ax.bar(x, ours, color="tab:blue", label="nanoserve (simulated)")
        ax.plot(x, [fig13[trace][s] for s in systems], "k*", markersize=12, label="published")
        ax.set_xticks(x, systems, rotation=20)
        ax.set_ylabel("# batched requests")
        ax.set_title(f"Fig. 13: {title}")
        ax.legend(fontsize=8)
    ax = axes[2]
    runs = table["sharegpt"]
    bottom = np.zeros(len(systems))
    for name, color in zip(SHARES, COLORS, strict=True):
        values = np.array([100 * runs[s][f"kv_share_{name}"] for s in systems])
        ax.bar(x, values, bottom=bottom, color=color, label=name)
        bottom += values
    held = [100 * (1 - runs[s]["kv_share_free"]) for s in systems]
    ax.plot(
        x,
        [fig2[s] * h / 100 for s, h in zip(systems, held, strict=True)],
        "k*",
        markersize=12,
        label="published token states\n(scaled to memory not free)",
    )
    ax.set_xticks(x, systems, rotation=20)
    ax.set_ylabel("% of the KV pool, time-averaged")
    ax.set_title("Fig. 2: KV memory, ShareGPT")
    ax.legend(fontsize=7)
    ax = axes[3]
    bounds = list(next(iter(capacity.values())))
    width = 0.8 / max(1, len(bounds))
    for i, bound in enumerate(bounds):
        rates = [capacity[s][bound]["rate"] or 0.0 for s in systems]
        ax.bar(
            x + (i - (len(bounds) - 1) / 2) * width,
            rates,
            width,
            label=f"normalized latency <= {bound} s/token",
        )
    ax.set_xticks(x, systems, rotation=20)
    ax.set_ylabel("sustainable rate (req/s)")
    ax.set_title("Fig. 12: sustainable ShareGPT rate")
    ax.legend(fontsize=7)
    save_figure(fig, png)
