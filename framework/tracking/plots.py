"""Pictures of a run, drawn from the files it left (`requests.csv`, `steps.csv`,
`metrics.json`, `config.yaml`), so any old run folder can be drawn again:

    python -m framework.tracking.plots outputs/2026-11-20/10-00-00

- `slot_timeline.png`: one lane per batch slot (`engine.max_num_seqs`) over the steps (the
  first `TIMELINE_STEPS` of a longer run); each request is a coloured span, a finished row
  that stays in the forward (static batching's waste) is grey and hatched, a preemption is
  an x, an empty slot is left blank.
- `kv_blocks.png`: KV blocks in use per step against the pool size, preemptions marked, and
  the waiting queue.
- `latency_cdf.png`: the distributions of time to first token and end-to-end latency.
- `replica_load.png` (a cluster only): each replica's rows and KV blocks in use over time,
  and with prefill/decode disaggregation the KV transfers each one sends or receives.

The timeline is rebuilt from timestamps: every event is stamped inside the step that ends
next, so a time maps to a step exactly. A request holds its row from its admission step to
the step before its release; a preempted request holds it only in the steps that sampled
its tokens. With deferred output the tokens of a window arrive together and are spread back
over the steps before, which can misplace a span by up to the window: the picture then says
on how many steps its row count differs from the engine's.
"""

from __future__ import annotations

import bisect
import csv
import json
import sys
from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.patches import Patch

from framework.tracking.figures import (
    StepColumns,
    envelope,
    num,
    plt,
    save_figure,
)
from framework.tracking.replica_plots import plot_replica_load
from framework.tracking.run_files import open_run_file, run_file

PLOTS = ("slot_timeline.png", "kv_blocks.png", "latency_cdf.png")
TIMELINE_STEPS = 2000  # the slot timeline's steps at most: a lane's spans stay visible
STAMP_ROUNDING = 1e-6  # requests.csv writes token times to the microsecond


# The columns of steps.csv the pictures read: a whole day's trace is a million steps, and a
# dict of all 29 columns a step held 2.7 GB while the plots drew (the run's peak).
STEP_PLOT_COLUMNS = ("step", "time", "rows", "blocks_in_use", "waiting", "preempted")


def read_csv(path: Path) -> list[dict[str, str]]:
    """Every row as a dict of its cells (empty for a missing file)."""
    if not path.is_file():
        return []
    with open_run_file(path) as f:
        return list(csv.DictReader(f))


def read_step_columns(path: Path, columns: tuple[str, ...] = STEP_PLOT_COLUMNS) -> StepColumns:
    """`columns` of steps.csv as arrays, parsed by numpy's C reader: a whole day's trace is
    a million rows, which `csv.DictReader` reads back as dicts at about half this speed. A
    missing column is refused by name."""
    with open_run_file(path) as f:
        head = f.readline().strip().split(",")
        has_rows = bool(f.readline().strip())
    missing = [c for c in columns if c not in head]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (has {', '.join(head)})")
    at = [head.index(c) for c in columns]
    if not has_rows:
        return {c: _typed(c, np.zeros(0)) for c in columns}
    table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=at, ndmin=2, dtype=np.float64)
    return {c: _typed(c, table[:, i]) for i, c in enumerate(columns)}


def step_columns(steps: Seq[Any], columns: tuple[str, ...] = STEP_PLOT_COLUMNS) -> StepColumns:
    """The same arrays from a finished run's steps in memory, so an observer that draws as
    the run ends need not read back the file it just wrote (the values are those steps.csv
    holds: a float's text there reads back to the same float). The engine's step log gives
    its columns whole (`column`); a list of steps is read step by step."""
    column = getattr(steps, "column", None)
    if callable(column):
        return {c: _typed(c, column(c)) for c in columns}
    return {
        c: _typed(c, np.fromiter((getattr(s, c) for s in steps), np.float64, len(steps)))
        for c in columns
    }


def _typed(column: str, values: np.ndarray) -> np.ndarray:
    """steps.csv's counts as int64; its seconds (`time`, `*_s`) and `window` stay floats."""
    if column in ("time", "window") or column.endswith("_s"):
        return values
    return values.astype(np.int64)


@dataclass(frozen=True)
class Span:
    """Steps `start`..`end` (inclusive) in which a request held a batch row."""

    request: str
    order: int  # the request's position in the workload, for its colour
    start: int
    end: int
    kind: str  # "busy" (computing its tokens) or "wasted" (finished, row still computed)
    preempted: bool = False  # the request was preempted right after this span


def step_of(step_ends: list[float], t: float) -> int:
    """The step in which an event stamped `t` happened: the first step ending at or after it
    (`len(step_ends)` for an event after the last forward, such as a final release)."""
    return bisect.bisect_left(step_ends, t - STAMP_ROUNDING)


def _runs(steps: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive step numbers, as (first, last)."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def request_spans(
    requests: list[dict[str, str]], step_ends: list[float], until: int | None = None
) -> list[Span]:
    """Where each admitted request held a row (see the module's note on accuracy); with
    `until`, only the requests admitted before that step (the slot timeline shows the first
    2,000 steps of a million: the rest's spans were two seconds of a whole trace's plots)."""
    spans: list[Span] = []
    last = len(step_ends) - 1
    for order, r in enumerate(requests):
        admitted, finished = num(r.get("admitted_s")), num(r.get("finished_s"))
        if admitted is None or finished is None:
            continue  # rejected, or never ran (an aborted run)
        a = step_of(step_ends, admitted)
        if until is not None and a >= until:
            continue  # a span starts at or after admission: none is shown
        f = min(step_of(step_ends, finished), last)
        released = num(r.get("released_s"))
        end = min(step_of(step_ends, released), last + 1) - 1 if released is not None else f
        if int(r.get("preemptions") or 0) == 0:
            busy = [(a, f)]
        else:
            per_step = Counter(step_of(step_ends, float(t)) for t in r["token_times_s"].split())
            held = [s for d, m in per_step.items() for s in range(d - m + 1, d + 1)]
            busy = _runs(held) or [(a, f)]
        for i, (s, e) in enumerate(busy):
            spans.append(Span(r["id"], order, s, e, "busy", preempted=i < len(busy) - 1))
        if end > busy[-1][1]:
            spans.append(Span(r["id"], order, busy[-1][1] + 1, end, "wasted"))
    return spans


def assign_lanes(spans: list[Span]) -> list[tuple[int, Span]]:
    """Each span on the lowest slot that is free when it starts; a request keeps its slot
    from one span to the next while it holds the row without a break."""
    lanes_end: list[int] = []  # the last step each lane is taken
    lane_of: dict[str, tuple[int, int]] = {}  # request -> (lane, end) of its last span
    out: list[tuple[int, Span]] = []
    for span in sorted(spans, key=lambda s: (s.start, s.order, s.kind != "busy")):
        prev = lane_of.get(span.request)
        if prev is not None and prev[1] == span.start - 1:
            lane = prev[0]
        else:
            lane = next((i for i, e in enumerate(lanes_end) if e < span.start), len(lanes_end))
            if lane == len(lanes_end):
                lanes_end.append(-1)
        lanes_end[lane] = span.end
        lane_of[span.request] = (lane, span.end)
        out.append((lane, span))
    return out


def plot_slot_timeline(
    requests: list[dict[str, str]],
    steps: StepColumns,
    max_num_seqs: int,
    path: Path,
    max_steps: int = TIMELINE_STEPS,
) -> Path:
    """The slots over the first `max_steps` steps (all of a run that short): a whole
    day's trace is a million steps and twenty thousand spans, which took matplotlib four
    minutes to draw into a picture nobody could read."""
    step_ends = steps["time"].tolist()
    total = len(step_ends)
    shown = min(total, max_steps)
    spans = [
        sp if sp.end < shown else Span(sp.request, sp.order, sp.start, shown - 1, sp.kind)
        for sp in request_spans(requests, step_ends, until=shown)
        if sp.start < shown
    ]
    placed = assign_lanes(spans)
    rows = steps["rows"][:shown].tolist()
    lanes = max([max_num_seqs, *(lane + 1 for lane, _ in placed)])
    width = min(max(8.0, shown / 8), 40.0)
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.35 * lanes))
    colours = plt.get_cmap("tab20")
    for lane, span in placed:
        n = span.end - span.start + 1
        if span.kind == "busy":
            ax.broken_barh([(span.start, n)], (lane + 0.1, 0.8), color=colours(span.order % 20))
            if n >= max(3, shown // 40):
                ax.text(
                    span.start + n / 2,
                    lane + 0.5,
                    span.request,
                    ha="center",
                    va="center",
                    fontsize=7,
                )
            if span.preempted:
                ax.plot(span.end + 1, lane + 0.5, "kx", ms=7)
        else:
            ax.broken_barh(
                [(span.start, n)],
                (lane + 0.1, 0.8),
                facecolor="0.85",
                edgecolor="0.5",
                hatch="///",
                lw=0.5,
            )
    per_step = Counter(s for _, sp in placed for s in range(sp.start, sp.end + 1))
    differ = sum(1 for i, r in enumerate(rows) if per_step.get(i, 0) != r)
    title = f"slot timeline: {max_num_seqs} slots x {shown} steps"
    if shown < total:
        title += f" (the first {shown:,} of {total:,})"
    if differ:
        title += f" (rebuilt from timestamps: {differ} steps differ from the engine's row count)"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(shown, 1))
    ax.set_ylim(0, lanes)
    ax.set_xlabel("step")
    ax.set_ylabel("batch slot")
    ax.set_yticks([i + 0.5 for i in range(lanes)], [str(i) for i in range(lanes)], fontsize=7)
    ax.invert_yaxis()
    ax.legend(
        handles=[
            Patch(color=colours(0), label="request computing (colour = request)"),
            Patch(facecolor="0.85", edgecolor="0.5", hatch="///", label="wasted: finished row"),
            Patch(facecolor="white", edgecolor="0.7", label="idle slot"),
            plt.Line2D([], [], color="k", marker="x", ls="", label="preempted"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
    )
    return save_figure(fig, path)


def plot_kv_blocks(steps: StepColumns, num_blocks: int | None, path: Path) -> Path:
    """Blocks in use and the waiting queue per step, each curve through its `envelope`."""
    x, used, queue = steps["step"], steps["blocks_in_use"], steps["waiting"]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    keep = envelope(used)
    ax.step(x[keep], used[keep], where="post", label="blocks in use")
    peak = int(used.max()) if len(used) else 0
    pool = f"pool {num_blocks} blocks" if num_blocks else "pool size unknown"
    if num_blocks and num_blocks <= 2 * peak:  # a pool far above the curve would flatten it
        ax.axhline(num_blocks, ls="--", color="0.4", lw=1, label=pool)
    else:
        pool += ", off the scale"
    at = np.flatnonzero(steps["preempted"])
    pre = list(zip(x[at].tolist(), used[at].tolist(), steps["preempted"][at].tolist(), strict=True))
    if pre:
        ax.plot([p[0] for p in pre], [p[1] for p in pre], "rv", label="preemption")
        for i, b, n in pre:
            if n > 1:
                ax.annotate(
                    str(n),
                    (i, b),
                    textcoords="offset points",
                    xytext=(0, 6),
                    fontsize=7,
                    color="r",
                    ha="center",
                )
    waiting = ax.twinx()
    keep = envelope(queue)
    waiting.step(x[keep], queue[keep], where="post", color="0.6", lw=0.8)
    waiting.set_ylabel("waiting requests", color="0.5")
    ax.set_xlabel("step")
    ax.set_ylabel("KV blocks")
    ax.set_title(
        f"KV blocks in use: peak {peak} ({pool}); {sum(p[2] for p in pre)} preemptions",
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=7)
    return save_figure(fig, path)


def plot_latency_cdf(requests: list[dict[str, str]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for col, label in (("ttft_s", "time to first token"), ("e2e_s", "end to end")):
        values = sorted(v for r in requests if (v := num(r.get(col))) is not None)
        if values:
            frac = [0.0] + [(i + 1) / len(values) for i in range(len(values))]
            ax.step(
                [values[0], *values],
                frac,
                where="post",
                label=f"{label} (p50 {_q(values, 0.5):.3g} s)",
            )
    ax.set_xlabel("seconds (this machine)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("latency CDF", fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # a run that finished no request draws no curve
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_bars(
    rows: list[dict[str, Any]], label: str, metrics: list[str], path: Path, title: str
) -> Path:
    """One panel per metric, one bar per row (a study's comparison at a glance)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.6), squeeze=False)
    names = [str(r[label]) for r in rows]
    for ax, metric in zip(axes[0], metrics, strict=True):
        values = [float(r[metric]) if r[metric] is not None else 0.0 for r in rows]
        ax.bar(range(len(rows)), values, color=plt.get_cmap("tab10")(range(len(rows))))
        ax.set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(metric, fontsize=9)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def _q(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def save_run_plots(run_dir: Path, steps: StepColumns | None = None) -> list[Path]:
    """Draw the three pictures of the run in `run_dir` into that folder; `steps`, the
    run's `step_columns` where the caller has them in memory, else read from steps.csv."""
    from omegaconf import OmegaConf

    requests = read_csv(run_dir / "requests.csv")
    if steps is None:
        steps = read_step_columns(run_file(run_dir, "steps.csv"))
    cfg = OmegaConf.load(run_dir / "config.yaml")
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    drawn = [
        plot_slot_timeline(
            requests, steps, int(cfg.engine.max_num_seqs), run_dir / "slot_timeline.png"
        ),
        plot_kv_blocks(steps, metrics.get("num_blocks"), run_dir / "kv_blocks.png"),
        plot_latency_cdf(requests, run_dir / "latency_cdf.png"),
    ]
    if metrics.get("replicas"):  # a cluster: its steps.csv says which replica ran each step
        columns = ("time", "rows", "blocks_in_use", "replica")
        load = read_step_columns(run_file(run_dir, "steps.csv"), columns)
        outages = metrics.get("replica_outages") or []
        drawn.append(plot_replica_load(load, run_dir / "replica_load.png", requests, outages))
    return drawn


if __name__ == "__main__":
    for folder in sys.argv[1:] or ["."]:
        for written in save_run_plots(Path(folder)):
            print(written)
