"""The capacity search's report (`python -m experiments.goodput`): the search as one JSON-ready
object (`report`), written as `goodput.md`, `goodput.csv` and `goodput.json` (`write_report`),
drawn as `goodput.png` (`draw_probes`: each condition's metric against the rate) and logged
as one MLflow run with a child run per probe (`log_search`). Every probe is in all of them,
with every number of its run's metrics.json (the JSON; the table a selection), each
condition's value and whether it held.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.studies.goodput_probes import COLUMNS, PROFILE_KEYS, TARGET_COLUMNS, Prober
from framework.studies.goodput_search import CapacityResult
from framework.studies.slo import ATTAINMENT, Condition
from framework.tracking.figures import plt, save_figure
from framework.tracking.tables import cell, markdown_table, write_csv
from framework.tracking.tags import environment_tags
from framework.tracking.tool_run import ChildRun, log_run

# Below this share of the offered rate served (finished requests / makespan over the rate),
# the run at the goodput may not have kept up: requests that piled up and were served after
# the arrivals ended make its SLO that of a burst of so many requests, not of a load the
# config sustains. A sustained run falls short of 1 by its drain alone (the last requests'
# latency against the arrivals' span), which long outputs lengthen too: a hint to check, not
# a verdict.
SUSTAINED = 0.8
# MLflow's names for a condition's operator (a metric's name takes no `<` or `>`).
_OP_NAMES = {"<=": "le", "<": "lt", ">=": "ge", ">": "gt"}


def slo_text(conditions: tuple[Condition, ...], targets: tuple[float, float] | None) -> str:
    """The SLO as the headline says it: `attainment 0.9 of TTFT <= 0.5 s and TPOT <= 0.05 s`,
    `scheduling_delay_p50_s <= 2 and tbt_p99_s <= 0.1`, or both."""
    parts = []
    for c in conditions:
        if c.metric == ATTAINMENT and targets is not None:
            ttft_s, tpot_s = targets
            said = f"attainment {c.bound:g} of TTFT <= {ttft_s:g} s and TPOT <= {tpot_s:g} s"
            parts.append(f"({said})" if len(conditions) > 1 else said)
        else:
            parts.append(str(c))
    return " and ".join(parts)


def goodput_line(r: CapacityResult, slo: str) -> str:
    """The headline, e.g. `goodput 6.2 req/s (bracket [6.2, 6.5]) at attainment 0.9 of ...`."""
    lo, hi = cell(r.low), cell(r.high)
    if r.status == "below":
        return f"goodput below {hi} req/s (no probe met {slo}; lowest probed {hi} req/s)"
    if r.status == "above":
        return (
            f"goodput at least {lo} req/s (every probe met {slo}, up to {lo} req/s: raise "
            "--max-probes, or the request count (workload.limit, workload.num_requests) if "
            "too few requests cannot load the config)"
        )
    note = "" if r.status == "converged" else ", not within the tolerance: out of probes"
    return f"goodput {lo} req/s (bracket [{lo}, {hi}]{note}) at {slo}"


def sustained_warning(rows: list[dict[str, Any]], goodput: float | None) -> str | None:
    """A warning when the run at the goodput served well under its offered rate (see
    `SUSTAINED`): then more requests, not a finer search, may change the answer."""
    row = next((r for r in rows if r["rate_rps"] == goodput), None)
    if row is None or row["served_ratio"] >= SUSTAINED:
        return None
    return (
        f"at the goodput the run served {row['throughput_rps']:.4g} req/s of the "
        f"{row['rate_rps']:.4g} offered ({row['served_ratio']:.0%}): either its "
        f"{row['requests']} requests piled up and were served after the arrivals ended, and "
        "this goodput then holds for a burst of that many requests, not for a sustained "
        "load, or the last requests' long outputs drew the run out; check that it holds "
        "with twice the requests (workload.limit, workload.num_requests)"
    )


def profile_label(profile: dict[str, Any], host_time: str) -> str:
    """What the seconds are: simulated, and on which profile."""
    parts = [f"cost model {profile.get('cost_model', '?')}", f"profile {profile.get('profile')}"]
    if profile.get("hardware"):
        parts.append(
            f"hardware {profile['hardware']} at tensor parallel {profile.get('tensor_parallel', 1)}"
        )
    return f"simulated seconds: {', '.join(parts)}, executor.host_time={host_time}"


def report(
    prober: Prober,
    result: CapacityResult,
    cfg: DictConfig,
    tolerance: float,
    command: str,
) -> dict[str, Any]:
    """The search as one JSON-ready object (`cfg`: the config at its own rate; `command`:
    what was asked for, as its report quotes it)."""
    targets = prober.targets
    target = next((c.bound for c in result.conditions if c.metric == ATTAINMENT), None)
    replicas = int(cfg.cluster.replicas)
    tp = int(prober.profile.get("tensor_parallel", 1))
    gpus = replicas * tp if prober.profile.get("hardware") else None
    slo = slo_text(result.conditions, targets)
    return {
        "goodput_rps": result.goodput,
        "bracket": [result.low, result.high],
        "status": result.status,
        "line": goodput_line(result, slo),
        "warning": sustained_warning(prober.rows, result.goodput),
        "slo": slo,
        "conditions": [
            {"metric": c.metric, "op": c.op, "bound": c.bound, "text": c.text}
            for c in result.conditions
        ],
        "ttft_s": targets[0] if targets else None,
        "tpot_s": targets[1] if targets else None,
        "attainment": target,
        "tolerance": tolerance,
        "replicas": replicas,
        "gpus": gpus,
        "goodput_per_gpu_rps": result.goodput / gpus if gpus and result.goodput else None,
        "seconds": profile_label(prober.profile, str(cfg.executor.host_time)),
        **{k: prober.profile.get(k) for k in PROFILE_KEYS},
        "workload": OmegaConf.to_container(cfg.workload, resolve=True),
        "command": command,
        "probes": prober.rows,
    }


def report_columns(data: dict[str, Any]) -> list[str]:
    """The table's columns: the probe, its verdict, each condition's metric and whether it
    held, then the run's chief figures (DistServe's attainment columns with its targets)."""
    cols = ["probe", "rate_rps", "met"]
    for c in data["conditions"]:
        cols += [c["metric"], c["text"]]
    skip = TARGET_COLUMNS if data["ttft_s"] is None else ()
    cols += [k for k in COLUMNS if k not in skip]
    return list(dict.fromkeys(cols))


def about(data: dict[str, Any], requests: int) -> str:
    """What the table's figures are, under the headline."""
    tags = environment_tags()
    held = "; ".join(c["text"] for c in data["conditions"])
    parts = [
        f"Every time is in {data['seconds']}.",
        f"A probe met the SLO (`met`) when every condition held: {held} (each a column of "
        "whether it held, beside its metric's value); a metric no request defined (-) meets "
        "no condition.",
    ]
    if data["ttft_s"] is not None:
        parts.append(
            f"Attainment: the share of all {requests} requests that finished with TTFT <= "
            f"{data['ttft_s']:g} s and TPOT <= {data['tpot_s']:g} s (one output token: TTFT "
            "alone), and ttft_met / tpot_met the share that met each target alone."
        )
    parts += [
        "The percentiles are over the finished requests (the scheduling delay's, arrival to "
        "first admission, over the admitted ones); tbt: every gap between a request's "
        "consecutive tokens; normalized_latency_s: the mean over requests of end-to-end "
        "latency over output tokens; served_ratio: requests finished per second of makespan "
        "over the offered rate.",
        f"Search: {data['status']}, tolerance {data['tolerance']:g}; every probe below, by "
        "rate (column `probe`: the order made), every number of its metrics.json in "
        f"goodput.json. Searched on {tags['machine.cpu']}, commit {tags['git.commit'][:10]}.",
    ]
    return " ".join(parts)


def write_report(out: Path, data: dict[str, Any]) -> str:
    """goodput.md, goodput.csv and goodput.json into `out`; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(data["probes"], key=lambda r: r["rate_rps"])
    cols = report_columns(data)
    write_csv(rows, cols, out / "goodput.csv")
    (out / "goodput.json").write_text(json.dumps(data, indent=2) + "\n")
    headline = f"**{data['line']}**"
    if data["goodput_per_gpu_rps"]:
        gpus = data["gpus"]
        per_gpu = cell(data["goodput_per_gpu_rps"])
        least = "at least " * (data["status"] == "above")
        headline += f"; {least}{per_gpu} req/s per GPU over {gpus} GPU{'s' * (gpus > 1)}"
    requests = rows[0]["requests"] if rows else 0
    warning = [f"**Warning:** {data['warning']}.", ""] if data["warning"] else []
    lines = ["# Goodput", "", f"`{data['command']}`", "", headline, "", *warning]
    text = "\n".join([*lines, about(data, requests), "", markdown_table(rows, cols), ""])
    (out / "goodput.md").write_text(text)
    return text


def draw_probes(data: dict[str, Any], path: Path) -> Path:
    """`goodput.png`: a panel per condition, its metric at each rate probed (a dot where it
    held, a cross where not), its bound dashed, the goodput dotted."""
    conditions = data["conditions"]
    rows = sorted(data["probes"], key=lambda r: r["rate_rps"])
    size = (3.6 * len(conditions), 3.4)
    fig, axes = plt.subplots(1, len(conditions), figsize=size, squeeze=False)
    for ax, c in zip(axes[0], conditions, strict=True):
        drawn = [r for r in rows if r.get(c["metric"]) is not None]
        ax.plot([r["rate_rps"] for r in drawn], [r[c["metric"]] for r in drawn], color="0.7")
        for held, marker, color in ((True, "o", "tab:green"), (False, "x", "tab:red")):
            mine = [r for r in drawn if r.get(c["text"]) is held]
            if mine:
                xs, ys = [r["rate_rps"] for r in mine], [r[c["metric"]] for r in mine]
                ax.scatter(xs, ys, marker=marker, color=color, label="held" if held else "failed")
        ax.axhline(c["bound"], ls="--", color="k", lw=1, label=f"{c['op']} {c['bound']:g}")
        if data["goodput_rps"] is not None:
            ax.axvline(data["goodput_rps"], ls=":", color="tab:blue", label="goodput")
        ax.set_xscale("log")
        ax.set_xlabel("rate (req/s)", fontsize=8)
        ax.set_title(c["text"], fontsize=9)
        ax.legend(fontsize=7)
    low, high = (cell(v) for v in data["bracket"])
    goodput = {"above": f"at least {low}", "below": f"below {high}"}.get(data["status"], low)
    title = f"goodput {goodput} req/s ({data['status']}, {len(rows)} probes)"
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def mlflow_key(name: str) -> str:
    """A row's key as an MLflow metric may be named: a condition's operator spelled out
    (`tbt_p99_s<=0.1` as `tbt_p99_s_le_0.1`)."""
    return re.sub(r"<=|>=|<|>", lambda m: f"_{_OP_NAMES[m.group()]}_", name)


def log_search(
    cfg: DictConfig, args: argparse.Namespace, files: list[Path], data: dict[str, Any]
) -> None:
    """The search as one MLflow run (kind `goodput`): its headline numbers and files, and a
    child run per probe with every number of its row (a verdict as 1 or 0)."""
    headline = {
        "goodput_rps": data["goodput_rps"],
        "goodput_per_gpu_rps": data["goodput_per_gpu_rps"],
        "probes": len(data["probes"]),
    }
    children = [
        ChildRun(
            f"probe {row['probe']}: {row['rate_rps']:.4g} req/s",
            {"nanoserve.kind": "goodput probe"},
            {"rate_rps": repr(row["rate_rps"]), "met": str(row.get("met"))},
            {mlflow_key(k): v for k, v in row.items() if isinstance(v, int | float)},
        )
        for row in data["probes"]
    ]
    params = {"goodput.slo_conditions": "; ".join(c["text"] for c in data["conditions"])}
    log_run(
        cfg,
        args,
        files,
        headline,
        tool="goodput",
        name=f"goodput at {data['slo']}"[:250],
        params=params,
        children=children,
    )
