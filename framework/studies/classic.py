"""The classic studies (`python run.py +experiment=NAME`): what each one compares and
measures. A `Study` names the labels that vary between its runs, the columns measured (each
read from a finished job's `RunRecord`), the columns drawn, and which runs must have done the
same work; `STUDIES` holds the eight, one per `conf/experiment/NAME.yaml` that names
`StudyReport` (framework/studies/study_report.py writes their tables).

Counts (token slots, waste, occupancy, preemptions) hold on any machine; the seconds
describe only the machine named in the table's heading.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from framework.studies.sweep_runs import RunRecord
from framework.tracking.figures import num


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
                "tbt_p50_s",
                "tbt_p99_s",
                "e2e_p50_s",
                "e2e_p99_s",
            ),
            ("slo_met", _slo_fraction),
            ("goodput_rps", _goodput),
            ("makespan_s", _metric("makespan_s")),
        ],
        plot=["ttft_p99_s", "tpot_p99_s", "tbt_p99_s", "goodput_rps"],
        defaults={"ttft_slo_s": 3.0, "tpot_slo_s": 0.15},
        note="chunk_size off: prefills are never cut (the unchunked schedule); prefill_chunks: "
        "prefill rows computed (a prefill served whole is one); tbt: time between tokens, "
        "every gap between a request's consecutive tokens, pooled; slo_met: share of "
        "requests with TTFT <= {ttft_slo_s} s and TPOT <= {tpot_slo_s} s; goodput_rps: "
        "those requests per second of makespan.",
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


def _fault_label(run: RunRecord, p: dict[str, Any]) -> str:
    """The outages of a run, as configured: `none`, or `R down A-B s` each."""
    faults = OmegaConf.select(run.config, "cluster.faults") or []
    spans = []
    for f in faults:
        up = "" if f.get("up_at_s") is None else f"{f.up_at_s:g}"
        spans.append(f"{f.replica} down {f.down_at_s:g}-{up} s")
    return ", ".join(spans) or "none"


STUDIES["failover"] = Study(
    title="Routers under a replica's failure",
    labels=[("router", _field("router.name")), ("fault", _fault_label)],
    columns=metrics(
        "requests_finished",
        "ttft_p50_s",
        "ttft_p99_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "replica_failures",
        "requests_rerouted",
        "tokens_recomputed_after_failure",
        "tokens_lost_in_failure",
        "makespan_s",
    ),
    plot=["ttft_p99_s", "e2e_p99_s", "requests_rerouted", "tokens_recomputed_after_failure"],
    group=lambda run: run.config.workload.kind,
    note="requests_rerouted: requests a failure sent back to the router (placed again on a "
    "live replica); tokens_recomputed_after_failure: positions the failed replica had "
    "computed that a live one computed again (the prompt and the tokens already delivered); "
    "tokens_lost_in_failure: tokens sampled on the failed replica's device and never read "
    "back (held by the output policy). Same-work check: every run gave the same tokens.",
)


def _chunk_label(run: RunRecord) -> Any:
    if run.config.scheduler.name != "chunked":
        return f"off ({run.config.scheduler.name})"
    size = run.config.scheduler.get("chunk_size")
    return "off" if size is None else size
