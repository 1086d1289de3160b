"""The classic studies as comparison tables: `python run.py +experiment=NAME`.

Each experiment config (`conf/experiment/NAME.yaml`) is a Hydra multirun: its sweeper
params list the policy combinations, and it adds `StudyReport` to `hydra.callbacks`. When
the last job has finished, `StudyReport` reads every job's folder, checks that the runs it
compares did the same work, and writes `NAME.md`, `NAME.csv` and `NAME.png` at the top of
the sweep folder (the sweep's MLflow parent run uploads them). A finished sweep's table can
be written again with `python -m experiments.studies NAME multirun/NAME/DATE`.

A comparison refuses to compare different work: runs in one comparison group (same
workload) must have produced the same tokens for the same requests (`outputs.jsonl`);
otherwise `DifferentWork` names the runs and the first request that differs, and nothing
is written. The one exception is the project's tie rule (`framework.run.greedy_check`): where
two runs of a real model first differ at a genuine fp32 tie (the two tokens' logits closer
than `TIE`, so a different batch shape or chunking may flip the argmax), the difference is
accepted and listed under the table.

Counts (token slots, waste, occupancy, preemptions) hold on any machine; the seconds
describe only the machine named in the table's heading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from experiments.policy.sweep_runs import (
    DifferentWork,
    ModelTies,
    RunRecord,
    check_same_work,
    load_sweep,
)
from experiments.toolkit import cli
from framework.tracking.plots import num, plot_bars
from framework.tracking.tables import markdown_table, write_csv
from framework.tracking.tags import environment_tags


# ---- derived columns ----------------------------------------------------------------------
def peak_rows(run: RunRecord) -> int:
    """The most requests that shared one forward: the admitted concurrency at its peak."""
    return max((int(s["rows"]) for s in run.steps), default=0)


def slo_met(run: RunRecord, ttft_s: float, tpot_s: float) -> list[bool]:
    """Per finished request: time to first token <= ttft_s and time per output token
    (after the first) <= tpot_s."""
    met = []
    for r in run.requests:
        ttft, first, done = num(r["ttft_s"]), num(r["first_token_s"]), num(r["finished_s"])
        if ttft is None or first is None or done is None:
            continue
        n = int(r["output_tokens"])
        tpot = (done - first) / (n - 1) if n > 1 else 0.0
        met.append(ttft <= ttft_s and tpot <= tpot_s)
    return met


def _metric(key: str) -> Callable[[RunRecord, dict[str, Any]], Any]:
    return lambda run, p: run.metrics.get(key)


def _field(path: str) -> Callable[[RunRecord, dict[str, Any]], Any]:
    return lambda run, p: OmegaConf.select(run.config, path)


def _workload_name(run: RunRecord, p: dict[str, Any]) -> str:
    lens = list(run.config.workload.get("output_lens") or [])
    names = {tuple(v): k for k, v in p.get("workloads", {}).items()}
    return names.get(tuple(lens), str(lens))


def _window(run: RunRecord, p: dict[str, Any]) -> Any:
    return run.config.window if run.config.output.name == "deferred" else run.config.output.name


def _slo_fraction(run: RunRecord, p: dict[str, Any]) -> float:
    met = slo_met(run, p["ttft_slo_s"], p["tpot_slo_s"])
    return sum(met) / len(met) if met else 0.0


def _goodput(run: RunRecord, p: dict[str, Any]) -> float:
    """Requests per second that met the SLO, over the run's makespan."""
    makespan = run.metrics.get("makespan_s") or 0.0
    return sum(slo_met(run, p["ttft_slo_s"], p["tpot_slo_s"])) / makespan if makespan else 0.0


Column = tuple[str, Callable[[RunRecord, dict[str, Any]], Any]]


def metrics(*keys: str) -> list[Column]:
    return [(k, _metric(k)) for k in keys]


@dataclass(frozen=True)
class Study:
    title: str
    labels: list[Column]  # what varies between runs
    columns: list[Column]  # what is measured
    plot: list[str]  # the columns drawn, one panel each
    group: Callable[[RunRecord], Hashable] = lambda run: "all"  # runs that must match
    defaults: dict[str, Any] = field(default_factory=dict)  # parameters and their defaults
    note: str = ""


STUDIES: dict[str, Study] = {
    "batching": Study(
        title="Static against continuous batching",
        labels=[("workload", _workload_name), ("scheduler", _field("scheduler.name"))],
        columns=metrics(
            "requests",
            "steps",
            "token_slots",
            "tokens_kept",
            "waste_fraction",
            "occupancy",
            "first_answer_s",
            "e2e_mean_s",
            "makespan_s",
        ),
        plot=["token_slots", "waste_fraction", "e2e_mean_s", "makespan_s"],
        group=lambda run: tuple(run.config.workload.output_lens),
        defaults={
            "workloads": {
                "straggler": [4, 4, 4, 4, 4, 4, 4, 32],
                "spread": [5, 8, 6, 120, 7, 9, 6, 11],
            }
        },
        note="token_slots: row-steps computed; waste: slots whose token nobody kept; "
        "occupancy: tokens kept / (slots available x steps); first_answer_s: when the first "
        "request finished; e2e_mean_s: mean request latency.",
    ),
    "allocation": Study(
        title="Worst-case against incremental KV allocation, tight pool, with a queue",
        labels=[("allocator", _field("allocator.name"))],
        columns=[
            *metrics("requests", "num_blocks", "peak_blocks", "steps", "occupancy"),
            ("mean_rows", _metric("mean_rows")),
            ("peak_rows", lambda run, p: peak_rows(run)),
            *metrics("preemptions", "recomputed_tokens", "token_slots", "e2e_mean_s", "makespan_s"),
        ],
        plot=["mean_rows", "preemptions", "recomputed_tokens", "makespan_s"],
        note="mean_rows / peak_rows: requests sharing a forward (admitted concurrency); "
        "recomputed_tokens: tokens whose KV was dropped by a preemption and computed again.",
    ),
    "deferral": Study(
        title="Deferred readback: the window sweep",
        # Whether the device ran beside the host (a GPU, or a simulated one): there a
        # held step lets the host's work hide behind the forward.
        labels=[("window", _window), ("overlap", _metric("overlap"))],
        columns=metrics(
            "requests",
            "steps",
            "transfers",
            "transfers_per_step",
            "overshoot_tokens",
            "expected_overshoot",
            "abandoned_tokens",
            "waste_fraction",
            "step_mean_s",
            "makespan_s",
        ),
        plot=["transfers_per_step", "overshoot_tokens", "waste_fraction", "step_mean_s"],
        note="overshoot: rows computed after their stop token, while it was still held on the "
        "device; expected: the (k+1)/2 model. python -m experiments.window_sweep runs the "
        "same sweep in one process, with the adaptive policy and per-phase times.",
    ),
    "trace": Study(
        title="Azure conversation trace, open loop, every scheduler x allocator",
        labels=[("scheduler", _field("scheduler.name")), ("allocator", _field("allocator.name"))],
        columns=[
            *metrics(
                "requests_finished",
                "preemptions",
                "ttft_p50_s",
                "ttft_p90_s",
                "ttft_p99_s",
                "tpot_p50_s",
                "tpot_p90_s",
                "tpot_p99_s",
                "e2e_p50_s",
                "e2e_p90_s",
                "e2e_p99_s",
            ),
            ("slo_met", _slo_fraction),
            ("goodput_rps", _goodput),
            ("makespan_s", _metric("makespan_s")),
        ],
        plot=["ttft_p90_s", "tpot_p90_s", "e2e_p90_s", "goodput_rps"],
        defaults={"ttft_slo_s": 2.0, "tpot_slo_s": 0.3},
        note="slo_met: share of requests with TTFT <= {ttft_slo_s} s and TPOT <= {tpot_slo_s} s "
        "(set hydra.callbacks.study.ttft_slo_s / tpot_slo_s); goodput_rps: those requests per "
        "second of makespan.",
    ),
    "chunking": Study(
        title="Chunked prefill: chunk sizes on an open-loop slice of the Azure trace",
        labels=[("chunk_size", lambda run, p: _chunk_label(run))],
        columns=[
            *metrics(
                "requests_finished",
                "steps",
                "prefill_tokens",
                "prefill_chunks",
                "ttft_p50_s",
                "ttft_p99_s",
                "tpot_p50_s",
                "tpot_p99_s",
                "itl_p50_s",
                "itl_p99_s",
                "e2e_p50_s",
                "e2e_p99_s",
            ),
            ("slo_met", _slo_fraction),
            ("goodput_rps", _goodput),
            ("makespan_s", _metric("makespan_s")),
        ],
        plot=["ttft_p99_s", "tpot_p99_s", "itl_p99_s", "goodput_rps"],
        defaults={"ttft_slo_s": 3.0, "tpot_slo_s": 0.15},
        note="chunk_size off: prefills are never cut (the unchunked schedule); prefill_chunks: "
        "prefill rows computed (a prefill served whole is one); itl: every gap between a "
        "request's consecutive tokens, pooled; slo_met: share of requests with TTFT <= "
        "{ttft_slo_s} s and TPOT <= {tpot_slo_s} s; goodput_rps: those requests per second "
        "of makespan.",
    ),
    "prefix": Study(
        title="Prefix caching and cache-aware scheduling on a shared-prefix workload",
        labels=[("allocator", _field("allocator.name")), ("scheduler", _field("scheduler.name"))],
        columns=[
            *metrics(
                "requests_finished",
                "steps",
                "prefix_hit_rate",
                "prefix_hit_tokens",
                "prefill_tokens",
            ),
            *metrics(
                "prefix_evictions",
                "preemptions",
                "ttft_p50_s",
                "ttft_p99_s",
                "e2e_p50_s",
                "output_tokens_per_s",
                "makespan_s",
            ),
        ],
        plot=["prefix_hit_rate", "prefill_tokens", "ttft_p50_s", "output_tokens_per_s"],
        note="prefix_hit_rate: prompt tokens found cached at admission / prompt tokens; "
        "prefix_hit_tokens: prefill tokens saved (found cached, not computed); evictions: "
        "cached blocks dropped for room; lpm: longest cached prefix first, aged, FCFS past "
        "scheduler.max_queue.",
    ),
    "routing": Study(
        title="Routers on a cluster of replicas with prefix caching",
        labels=[
            ("workload", _field("workload.kind")),
            ("router", _field("router.name")),
        ],
        columns=[
            *metrics(
                "requests_finished",
                "output_tokens_per_s",
                "ttft_p50_s",
                "ttft_p99_s",
                "tpot_p50_s",
                "tpot_p99_s",
                "prefix_hit_rate",
                "load_imbalance",
            ),
            ("slo_met", _slo_fraction),
            ("goodput_rps", _goodput),
            ("makespan_s", _metric("makespan_s")),
        ],
        plot=["output_tokens_per_s", "ttft_p99_s", "prefix_hit_rate", "goodput_rps"],
        group=lambda run: run.config.workload.kind,
        defaults={"ttft_slo_s": 5.0, "tpot_slo_s": 0.1},
        note="prefix_hit_rate: the cluster's prompt tokens found cached at admission / prompt "
        "tokens; load_imbalance: the largest replica's served tokens (prompt + output) over "
        "the mean; slo_met: share of requests with TTFT <= {ttft_slo_s} s and TPOT <= "
        "{tpot_slo_s} s; goodput_rps: those requests per second of makespan.",
    ),
}


def _chunk_label(run: RunRecord) -> Any:
    if run.config.scheduler.name != "chunked":
        return f"off ({run.config.scheduler.name})"
    size = run.config.scheduler.get("chunk_size")
    return "off" if size is None else size


# ---- the report (the format: framework/tracking/tables.py) --------------------------------
def build_rows(
    study: Study, runs: list[RunRecord], params: dict[str, Any], ties: list[str] | None = None
) -> list[dict]:
    got = check_same_work(runs, study.group, ModelTies())
    if ties is not None:
        ties.extend(got)
    return [{name: fn(run, params) for name, fn in study.labels + study.columns} for run in runs]


def heading(runs: list[RunRecord]) -> str:
    tags = environment_tags()
    cfg = runs[0].config
    dirty = " with local changes" if tags["git.dirty"] == "true" else ""
    m = runs[0].metrics
    profile = Path(str(m.get("profile", "?"))).name
    if m.get("executor") == "simulated":  # the seconds are predictions, not measurements
        return (
            f"Simulated {time.strftime('%Y-%m-%d')} (executor=simulated, virtual clock, "
            f"{m.get('cost_model', '?')} profile {profile}; computed on "
            f"{tags['machine.cpu']}), model {cfg.model.source}, {cfg.dtype}, commit "
            f"{tags['git.commit'][:10]}{dirty}. Counts hold on any machine; the seconds are "
            f"the profile's predictions for the machine it describes."
        )
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {tags['machine.cpu']} "
        f"({tags['machine.cores']} cores, GPU: {tags['machine.gpu']}), model {cfg.model.source}, "
        f"device {cfg.device}, {cfg.dtype}, threads {cfg.threads or 'default'}, commit "
        f"{tags['git.commit'][:10]}{dirty}. Counts hold on any machine; seconds describe "
        f"only this one."
    )


def write_report(name: str, runs: list[RunRecord], params: dict[str, Any], out: Path) -> Path:
    """`NAME.md`, `NAME.csv` and `NAME.png` in `out`; returns the Markdown file."""
    study = STUDIES[name]
    params = {**study.defaults, **params}
    ties: list[str] = []
    rows = build_rows(study, runs, params, ties)
    cols = list(rows[0])
    write_csv(rows, cols, out / f"{name}.csv")
    note = study.note.format(**params)
    if ties:
        note += "\n\nTies accepted (greedy outputs that first differ at a genuine fp32 tie):\n"
        note += "".join(f"\n- {t}" for t in ties)
    text = f"## {study.title}\n\n{heading(runs)}\n\n{markdown_table(rows, cols)}\n\n{note}\n"
    md = out / f"{name}.md"
    md.write_text(text)
    for r in rows:
        r["run"] = " / ".join(str(r[label]) for label, _ in study.labels)
    plot_bars(rows, "run", study.plot, out / f"{name}.png", study.title)
    return md


class StudyReport(Callback):
    """Hydra callback (`hydra.callbacks.study`): the study's table once the sweep is done.
    Extra fields of the callback's config are the study's parameters (an SLO, say)."""

    def __init__(self, name: str, **params: Any) -> None:
        if name not in STUDIES:
            raise ValueError(f"unknown study {name!r}; studies: {', '.join(STUDIES)}")
        self.name = name
        self.params = params

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra reports a callback's exception as a mere warning; a refusal must fail the
        command, so it leaves as SystemExit, with its reason also written down in the sweep
        folder (`NAME.refused.txt`, uploaded to the sweep's MLflow run)."""
        sweep_dir = Path(config.hydra.sweep.dir)
        params = OmegaConf.to_container(OmegaConf.create(self.params), resolve=True)
        try:
            md = write_report(self.name, load_sweep(sweep_dir), params, sweep_dir)
        except (DifferentWork, FileNotFoundError) as exc:
            (sweep_dir / f"{self.name}.refused.txt").write_text(f"{exc}\n")
            raise SystemExit(f"study {self.name}: {exc}") from exc
        print(md.read_text(), flush=True)
        print(f"study {self.name}: {md}, .csv and .png", flush=True)


def main(argv: list[str] | None = None) -> Path:
    """Write a finished sweep's table again: `python -m experiments.studies NAME SWEEP_DIR`."""
    ap = cli.parser("A finished sweep's study table, written again into its folder.")
    ap.add_argument("name", choices=list(STUDIES), help="the study (conf/experiment/NAME.yaml)")
    ap.add_argument("sweep_dir", type=Path, help="the sweep's folder (multirun/NAME/DATE)")
    args = ap.parse_args(argv)
    md = write_report(args.name, load_sweep(args.sweep_dir), {}, args.sweep_dir)
    print(md.read_text())
    return md
