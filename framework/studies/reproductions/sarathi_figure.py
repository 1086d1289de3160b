"""The Sarathi-Serve paper's capacity figure as it draws it: capacity bars per system under the
strict and relaxed SLOs, Mistral-7B on one A100. The paper states no bar's value, only the
ratio to vLLM (2.6x), so the published mark is that ratio times the simulated vLLM bar, on the
strict Sarathi-Serve bar; a second panel sets the simulated ratios beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from framework.tracking.figures import plt, save_figure

COLORS = {"vLLM": "tab:orange", "Orca": "tab:green", "Sarathi-Serve": "tab:blue"}


def draw(png: Path, capacity: dict[str, dict[str, Any]], published_ratio: float) -> None:
    slos = list(capacity)
    systems = list(next(iter(capacity.values())))
    x = np.arange(len(slos))
    width = 0.8 / len(systems)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=(2, 1))
    for i, system in enumerate(systems):
        rates = [capacity[slo][system]["rate"] or 0.0 for slo in slos]
        offset = (i - (len(systems) - 1) / 2) * width
        bars = ax.bar(x + offset, rates, width, color=COLORS.get(system), label=system)
        ax.bar_label(bars, fmt="%.2f", fontsize=8, label_type="center", color="white")
        if system == "Sarathi-Serve":
            vllm = capacity[slos[0]]["vLLM"]["rate"]
            if vllm:
                ax.plot(
                    [x[0] + offset],
                    [published_ratio * vllm],
                    "k*",
                    markersize=14,
                    label=f"published: {published_ratio:g}x the simulated vLLM",
                )
    top = max([capacity[s][y]["rate"] or 0.0 for s in slos for y in systems] + [1.0])
    ax.set_ylim(0, 1.35 * top)  # room for the legend above the bars
    ax.set_xticks(x, [f"SLO-{slo[0].upper()} ({slo})" for slo in slos])
    ax.set_ylabel("capacity (queries per second)")
    ax.set_title("Mistral-7B, one A100-80GB PCIe, openchat ShareGPT-4")
    ax.legend(fontsize=8)
    ratios = []
    for slo in slos:
        ours, theirs = capacity[slo]["Sarathi-Serve"]["rate"], capacity[slo]["vLLM"]["rate"]
        ratios.append(ours / theirs if ours and theirs else 0.0)
    bars = bx.bar(x, ratios, 0.5, color="tab:blue", label="simulated")
    bx.bar_label(bars, fmt="%.2fx", fontsize=8, label_type="center", color="white")
    bx.plot([x[0]], [published_ratio], "k*", markersize=14, label="published (abstract)")
    bx.axhline(1.0, color="gray", linewidth=0.8)
    bx.set_ylim(0, 1.35 * max([*ratios, published_ratio]))
    bx.set_xticks(x, slos)
    bx.set_ylabel("Sarathi-Serve / vLLM capacity")
    bx.set_title("Capacity ratio")
    bx.legend(fontsize=8)
    save_figure(fig, png)
