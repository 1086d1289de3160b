"""The simulator check's rows: per case the counts and each time metric, real against
simulated, with a verdict against the targets; where the seconds go, by step kind; every
closed-loop step paired."""

from __future__ import annotations

import statistics
from typing import Any

from experiments.sim.check_sides import Runs, makespan
from framework.core.step_stats import HOST_PHASES
from framework.engine.loop import RunResult
from framework.executors.simulated.features import NAMES
from framework.run.summary import summarize

# The counts compared and shown (the summary's keys): on a closed loop they are the schedule's
# alone, so a simulation that runs the same engine must reproduce them exactly.
COUNTS = ("steps", "token_slots", "preemptions", "recomputed_tokens", "overshoot_tokens")
# Every count of the summary that a closed loop fixes; `window` is left out (an adaptive
# output policy reads it off measured seconds) as in tests/test_simulated.py.
SAME = ("requests_finished", "tokens_kept", "prefill_tokens", "peak_blocks", "transfers")
SAME += ("deferred_tokens", "max_preemptions_per_request")
# metric name -> (summary key, target: the largest |relative error| that meets it)
METRICS = {
    "makespan": ("makespan_s", 0.05),
    "throughput": ("output_tokens_per_s", 0.05),
    "ttft_p50": ("ttft_p50_s", 0.05),
    "ttft_p99": ("ttft_p99_s", 0.10),
    "tpot_p50": ("tpot_p50_s", 0.05),
    "tpot_p99": ("tpot_p99_s", 0.10),
    "e2e_p50": ("e2e_p50_s", 0.05),
    "e2e_p99": ("e2e_p99_s", 0.10),
}
COLUMNS = ("case", "workload", "scheduler", "allocator", "output", "closed_loop", "requests")
COLUMNS += ("real_runs", "counts_equal")
COLUMNS += tuple(f"{k}_{side}" for k in COUNTS for side in ("real", "sim"))
COLUMNS += tuple(
    f"{m}_{part}" for m in METRICS for part in ("real", "sim", "error", "spread", "verdict")
)
COLUMNS += (
    "e2e_mape",
    "others_cpu_max",
    "canary_slow",
    "prefill_slow",
    "retried_runs",
    "makespan_runs",
    "note",
)
KINDS = ("prefill", "decode", "mixed")
STEP_COLUMNS = ("case", "kind", "steps_real", "steps_sim", "forward_real_s", "forward_sim_s")
STEP_COLUMNS += ("forward_error", "forward_step_mape", "sample_real_s", "sample_sim_s")
STEP_COLUMNS += ("host_real_s", "host_sim_s", "host_error")
PAIR_COLUMNS = ("case", "step", "kind", *NAMES, "forward_real_s", "forward_sim_s")
PAIR_COLUMNS += ("sample_real_s", "sample_sim_s", "host_real_s", "host_sim_s")
MET, SPREAD, NOT_MET = "met", "within real spread", "not met"


def rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return sim / real - 1


def verdict(error: float | None, spread: float | None, target: float) -> str:
    """`met` within the target; else `within real spread` when the real runs themselves
    moved more than the error; else `not met`."""
    if error is None:
        return "-"
    if abs(error) <= target:
        return MET
    if spread is not None and abs(error) <= spread:
        return SPREAD
    return NOT_MET


def e2e_by_request(result: RunResult) -> dict[str, float]:
    return {s.id: s.finished_at - s.arrival for s in result.seqs if s.finished_at is not None}


def e2e_mape(real: list[RunResult], sim: RunResult) -> float | None:
    """Mean over requests of |sim e2e - real e2e| / real e2e, the real e2e being the median
    over the real runs of that request's."""
    per = [e2e_by_request(r) for r in real]
    got = e2e_by_request(sim)
    errors = []
    for rid, value in got.items():
        seen = [p[rid] for p in per if rid in p]
        if seen:
            ref = statistics.median(seen)
            if ref > 0:
                errors.append(abs(value - ref) / ref)
    return statistics.mean(errors) if errors else None


def counts_of(result: RunResult) -> dict[str, Any]:
    s = summarize(result)
    return {k: s[k] for k in (*COUNTS, *SAME)}


def make_row(r: Runs) -> dict[str, Any]:
    assert r.sim is not None
    case = r.case
    real_counts = [counts_of(x) for x in r.real]
    sim_counts = counts_of(r.sim)
    shown = counts_of(r.median_real())
    row: dict[str, Any] = {"case": case.name, "workload": case.workload}
    row |= dict(zip(("scheduler", "allocator", "output"), case.combo, strict=True))
    row |= {"closed_loop": case.closed, "requests": len(r.specs), "real_runs": len(r.real)}
    row["counts_equal"] = all(c == sim_counts for c in real_counts)
    notes = []
    if case.closed and any(c != real_counts[0] for c in real_counts):
        notes.append("the real runs' counts differ among themselves")
    for k in COUNTS:
        row[f"{k}_real"], row[f"{k}_sim"] = shown[k], sim_counts[k]
    summaries = [summarize(x) for x in r.real]
    sim = summarize(r.sim)
    for name, (key, target) in METRICS.items():
        values = [s[key] for s in summaries if s[key] is not None]
        real = statistics.median(values) if values else None
        spread = (max(values) - min(values)) / real if values and real else None
        error = rel(sim[key], real)
        row |= {f"{name}_real": real, f"{name}_sim": sim[key], f"{name}_error": error}
        row |= {f"{name}_spread": spread if len(values) > 1 else None}
        row[f"{name}_verdict"] = verdict(error, spread if len(values) > 1 else None, target)
    row["e2e_mape"] = e2e_mape(r.real, r.sim)
    row["others_cpu_max"] = max(r.foreign) if r.foreign else None
    row["canary_slow"] = statistics.median(r.slow) if r.slow else None
    row["prefill_slow"] = statistics.median(r.prefill_slow) if r.prefill_slow else None
    row["makespan_runs"] = " ".join(f"{makespan(x):.4f}" for x in r.real)
    row["retried_runs"] = r.retried
    if case.workload == "tight_pool" and not shown["preemptions"]:
        notes.append("the tight pool did not preempt: lower --tight-blocks")
    row["note"] = "; ".join(notes)
    return row


def kind(st: Any) -> str:
    if st.decode_rows == 0:
        return "prefill"
    return "decode" if st.prefill_rows == 0 else "mixed"


def host_s(st: Any) -> float:
    """The engine's own seconds in a step (the executor's block tables included, in
    `build`), or, under modelled host time, the modelled cost."""
    return sum(st.phase_s.get(p, 0.0) for p in (*HOST_PHASES, "host"))


def step_rows(r: Runs) -> list[dict[str, Any]]:
    """Where the seconds go: per step kind (and all), the real median run against the
    simulation. On a closed loop the steps pair one to one (the same schedule), which gives
    each kind's per-step forward MAPE too."""
    assert r.sim is not None
    real, sim = r.median_real().steps, r.sim.steps
    same = paired(r)
    out = []
    for k in (*KINDS, "all"):
        a = [st for st in real if k in ("all", kind(st))]
        b = [st for st in sim if k in ("all", kind(st))]
        if not a and not b:
            continue
        fa = sum(st.phase_s.get("forward", 0.0) for st in a)
        fb = sum(st.phase_s.get("forward", 0.0) for st in b)
        ha, hb = sum(host_s(st) for st in a), sum(host_s(st) for st in b)
        mape = None
        if same:
            pairs = [
                (x.phase_s.get("forward", 0.0), y.phase_s.get("forward", 0.0))
                for x, y in zip(real, sim, strict=True)
                if k in ("all", kind(x))
            ]
            errs = [abs(y / x - 1) for x, y in pairs if x > 0]
            mape = statistics.mean(errs) if errs else None
        out.append(
            {
                "case": r.case.name,
                "kind": k,
                "steps_real": len(a),
                "steps_sim": len(b),
                "forward_real_s": fa,
                "forward_sim_s": fb,
                "forward_error": rel(fb, fa),
                "forward_step_mape": mape,
                "sample_real_s": sum(st.phase_s.get("sample", 0.0) for st in a),
                "sample_sim_s": sum(st.phase_s.get("sample", 0.0) for st in b),
                "host_real_s": ha,
                "host_sim_s": hb,
                "host_error": rel(hb, ha),
            }
        )
    return out


def paired(r: Runs) -> bool:
    """The real median run and the simulation took the same steps (a closed loop does)."""
    assert r.sim is not None
    real, sim = r.median_real().steps, r.sim.steps
    return r.case.closed and [kind(a) for a in real] == [kind(b) for b in sim]


def pair_rows(r: Runs) -> list[dict[str, Any]]:
    """Every step of a closed-loop case: its features, and the real median run's seconds
    beside the predicted ones (for refitting or diagnosing by hand)."""
    if not paired(r):
        return []
    assert r.sim is not None
    out = []
    for i, (a, b, f) in enumerate(zip(r.median_real().steps, r.sim.steps, r.features, strict=True)):
        out.append(
            {
                "case": r.case.name,
                "step": i,
                "kind": kind(a),
                **f.as_dict(),
                "forward_real_s": a.phase_s.get("forward", 0.0),
                "forward_sim_s": b.phase_s.get("forward", 0.0),
                "sample_real_s": a.phase_s.get("sample", 0.0),
                "sample_sim_s": b.phase_s.get("sample", 0.0),
                "host_real_s": host_s(a),
                "host_sim_s": host_s(b),
            }
        )
    return out
