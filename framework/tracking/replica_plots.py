"""A cluster's picture, `replica_load.png`: each replica's rows in the forward and KV blocks
in use over time, and with prefill/decode disaggregation the KV transfers each one sends or
receives, each replica in one colour across the panels; a replica's outages
(`cluster.faults`) shaded in its colour, from its failure to its return."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from framework.tracking.figures import StepColumns, envelope, num, plt, save_figure


def transfers_in_flight(
    requests: list[dict[str, str]],
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per replica, the KV transfers it sends or receives at each time (a disaggregated
    cluster's `requests.csv`, from `kv_start_s` to `kv_done_s`): (times, counts), a step
    curve. Empty when the run made no transfer."""
    events: dict[int, list[tuple[float, int]]] = {}
    for r in requests:
        start, done = num(r.get("kv_start_s")), num(r.get("kv_done_s"))
        if start is None or done is None:
            continue
        for side in (r["replica"], r["decode_replica"]):
            events.setdefault(int(side), []).extend(((start, 1), (done, -1)))
    curves = {}
    for replica, marks in sorted(events.items()):
        marks.sort()
        times = np.array([t for t, _ in marks])
        counts = np.cumsum([d for _, d in marks])
        curves[replica] = (times, counts)
    return curves


def plot_replica_load(
    steps: StepColumns,
    path: Path,
    requests: list[dict[str, str]] | None = None,
    outages: list[dict[str, Any]] | None = None,
) -> Path:
    """A cluster's replicas over time: each one's rows in the forward and KV blocks in use at
    each of its steps (`steps` with a `replica` column), each curve through its `envelope`;
    with KV transfers between them (`requests` of a disaggregated run), a third panel of
    the transfers each replica sends or receives."""
    moving = transfers_in_flight(requests or [])
    panels = 3 if moving else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 2.5 * panels), sharex=True)
    rows_ax, blocks_ax = axes[0], axes[1]
    replica = steps["replica"]
    for r in np.unique(replica).tolist():
        mine = replica == r
        t = steps["time"][mine]
        for ax, column in ((rows_ax, "rows"), (blocks_ax, "blocks_in_use")):
            values = steps[column][mine]
            keep = envelope(values)
            color = f"C{r % 10}"  # a replica's colour in every panel
            ax.step(t[keep], values[keep], where="post", lw=0.8, color=color, label=f"replica {r}")
    rows_ax.set_ylabel("rows in the forward")
    blocks_ax.set_ylabel("KV blocks in use")
    if moving:
        kv_ax = axes[2]
        for r, (t, counts) in moving.items():
            keep = envelope(counts)
            kv_ax.step(t[keep], counts[keep], where="post", lw=0.8, color=f"C{r % 10}")
        kv_ax.set_ylabel("KV transfers\nsent or received")
    end = float(steps["time"].max()) if len(steps["time"]) else 0.0
    for n, o in enumerate(outages or []):  # metrics.json's `replica_outages`
        up = o["up_s"] if o["up_s"] is not None else max(end, o["down_s"])
        label = "replica down" if n == 0 else None
        for ax in axes:
            color = f"C{int(o['replica']) % 10}"
            ax.axvspan(o["down_s"], up, color=color, alpha=0.15, hatch="//", lw=0, label=label)
            label = None
    axes[-1].set_xlabel("time (s)")
    rows_ax.set_title("load per replica", fontsize=10)
    rows_ax.legend(loc="upper right", fontsize=7, ncol=4)
    return save_figure(fig, path)
