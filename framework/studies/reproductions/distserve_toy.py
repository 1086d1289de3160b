"""DistServe's toy experiment (the DistServe blog post, Figure 6; OSDI 2024): one 13B model on
A100-80GBs, requests of 512 prompt and 64 output tokens arriving as a Poisson process, an SLO
of P90 TTFT <= 0.4 s and P90 TPOT <= 0.04 s. A colocated GPU against two prefill GPUs and one
decode GPU (2P1D), by goodput per GPU.

Every number is a capacity search (`goodput_search.find_capacity`) over the Poisson rate on
one serving layout, each a nanoserve setting, nothing paper-specific:

- **colocated**: one GPU serving requests whole, vLLM's scheduler of the time
  (`scheduler=prefill_first`: prefills in iterations of their own, decodes wait);
- **prefill-only**: one GPU that only prefills: the same engine on requests of one output
  token, each ending at its first token (a prefill replica's work without the hand-off; a
  1P1D run at the rate found checks that the hand-off changes nothing);
- **decode-only**: the decode GPU of an nP1D cluster (`cluster.roles`), with enough prefill
  GPUs at every probed rate that the decode GPU sees the whole offered load: n = ceil(rate /
  (`PREFILL_LOAD` x the prefill-only rate)), each prefill GPU then carrying at most that share
  of the load it sustains within the TTFT target;
- **2P1D**: `cluster.roles=[prefill,prefill,decode]`, the KV over NVLink 3 (`cluster.link`).

The colocated GPU's TTFT- and TPOT-limited rates are searches under one percentile each; its
goodput, and the 2P1D cluster's, under both (the blog's reading of its SLO, the percentile
form); DistServe's attainment form (90% of all requests meet both targets) is searched too
and reported beside. The 2P1D goodput per GPU is also computed from the prefill-only and
decode-only rates as the blog computes it, min(2 x prefill, decode) / 3.

Each layout's runs are kept by rate: a grid of rates run first (in parallel, the figure's
curves), then each search starts from the bracket the grid gives and bisects. Beside the
headline cells, the same searches run with DistServe's own profiled step costs
(`distserve_costs.py`), to tell a difference in step costs from one in scheduling; they are a
diagnosis, never a cell.

`--quick` runs 40 requests a probe (too few for a queue to build at high rates: its rates
are no measurement), a coarse grid, searches of one probe past the grid's bracket, and no
diagnosis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framework.engine.loop import RunResult
from framework.engine.step_log import StepLog
from framework.run.paths import ROOT
from framework.studies.reproductions.cells import PaperSetup
from framework.studies.reproductions.distserve_cells import FIRST_TTFT, PUBLISHED, cells
from framework.studies.reproductions.distserve_costs import write_profiles
from framework.studies.reproductions.distserve_figure import draw
from framework.studies.reproductions.distserve_tables import (
    assumptions,
    costs_section,
    diagnosis_section,
    forms_section,
    setup,
    shape_section,
)
from framework.studies.reproductions.jobs import JobOutcome
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.studies.reproductions.search import Found, SearchJob, rate_override
from framework.studies.slo import ATTAINMENT, Condition, attainment, parse_condition

OPT_13B = ROOT / "framework" / "executors" / "simulated" / "models" / "opt-13b"
# The blog's set-up: "a 13B LLM" (read as OPT-13B, papers.md) on one A100-80GB a replica.
PAPER = PaperSetup(
    "OPT-13B on A100-80GBs",
    {"model.path": str(OPT_13B), "executor.hardware": "a100-80gb", "executor.tensor_parallel": 1},
)
PROMPT, OUTPUT = 512, 64  # tokens, every request
TTFT_S, TPOT_S = 0.4, 0.04  # the SLO's P90 targets
TARGET = 0.9  # the attainment form: the share of all requests that must meet both
LINK = "nvlink3"  # the blog's toy keeps its three GPUs in one A100 node
PREFILL_LOAD = 0.75  # decode-only: each prefill GPU carries at most this x its own rate

# OPT-13B's shape in fp16 on an A100-80GB (the analytic profile, its own host seconds, so
# every machine simulates the same schedule); vLLM 0.2's batch caps for OPT (256 sequences,
# max(2,048, the context) tokens a step) and a KV pool of 45 GiB (vLLM's 90% of the GPU less
# the weights and activations); fixed lengths under Poisson arrivals.
BASE = (
    "executor=simulated",
    "executor.hardware=a100-80gb",
    "executor.host_time=model",
    "executor.software=distserve",  # the blog's engine: DistServe's own (software/distserve.yaml)
    "model=hf",
    f"model.path={OPT_13B}",
    "dtype=float16",
    "scheduler=prefill_first",
    "router=least_outstanding",
    "engine.max_num_seqs=256",
    "engine.max_num_batched_tokens=2048",
    "engine.kv_memory_mb=46080",
    "workload=synthetic",
    "workload.prompt_len_dist=fixed",
    f"workload.prompt_len_mean={PROMPT}",
    f"workload.prompt_len_max={PROMPT}",
    "workload.output_len_dist=fixed",
    f"workload.output_len_mean={OUTPUT}",
    f"workload.output_len_max={OUTPUT}",
    "workload.arrival=poisson",
)
PREFILL_ONLY = ("workload.output_len_mean=1",)

SQRT2 = math.sqrt(2.0)
FULL: dict[str, Any] = {
    "requests": 1000,
    "grid": tuple(round(SQRT2**k, 4) for k in range(12)),  # 1 .. 45 req/s
    "probes": 12,
    "tolerance": 0.05,
    "diagnosis": True,
}
QUICK: dict[str, Any] = {
    "requests": 40,
    "grid": (3.0, 6.0, 12.0, 24.0),
    "probes": 3,
    "tolerance": 0.5,
    "diagnosis": False,
}


def percentile_slo() -> list[Condition]:
    """The blog's SLO: each P90 on its own, over the finished requests."""
    return [parse_condition(f"ttft_p90<={TTFT_S:g}"), parse_condition(f"tpot_p90<={TPOT_S:g}")]


def attainment_slo() -> list[Condition]:
    """DistServe's goodput rule: at least 90% of all requests meet both targets."""
    return [Condition(ATTAINMENT, ">=", TARGET)]


def roles(prefill: int, decode: int) -> tuple[str, ...]:
    """A disaggregated cluster of `prefill` + `decode` GPUs, its KV over `LINK`."""
    names = ",".join(["prefill"] * prefill + ["decode"] * decode)
    return (
        f"cluster.replicas={prefill + decode}",
        f"cluster.roles=[{names}]",
        f"cluster.link={LINK}",
    )


def prefills_for(rate: float, prefill_rate: float) -> int:
    """Decode-only: the prefill GPUs that keep the decode GPU fed at `rate` (module note)."""
    return max(1, math.ceil(rate / (PREFILL_LOAD * prefill_rate)))


def measured(result: RunResult) -> dict[str, Any]:
    """What a run's summary lacks: DistServe's attainment (and each target's share alone),
    and the step seconds the cost model gave: a one-prompt prefill iteration, and the mean
    decode-only iteration with its mean rows."""
    seqs = result.seqs
    out: dict[str, Any] = {
        ATTAINMENT: attainment(seqs, TTFT_S, TPOT_S),
        "ttft_met": attainment(seqs, TTFT_S, math.inf),
        "tpot_met": attainment(seqs, math.inf, TPOT_S),
    }
    log = result.steps if isinstance(result.steps, StepLog) else StepLog.of(result.steps)
    forward = log.column("forward_s")
    pre, dec = log.column("prefill_rows"), log.column("decode_rows")
    one = (pre == 1) & (dec == 0) & (log.column("prefill_tokens") == PROMPT)
    decode = (pre == 0) & (dec > 0)
    out["prefill_step_s"] = float(forward[one].mean()) if one.any() else None
    out["decode_step_s"] = float(forward[decode].mean()) if decode.any() else None
    out["decode_step_rows"] = float(dec[decode].mean()) if decode.any() else None
    return out


@dataclass(frozen=True)
class Layout:
    """One serving layout: what the tables call it (`key`), its name in the results
    (`name`), its own settings (`fixed`) and those that follow the rate (`at`, the rate
    itself among them). Every search of a layout shares its runs (`ctx.search`)."""

    key: str
    name: str
    fixed: tuple[str, ...]
    at: Callable[[float], tuple[str, ...]] = rate_override

    def search(
        self, name: str, conditions: Sequence[Condition], size: dict[str, Any], label: str
    ) -> SearchJob:
        """The search of this layout under `conditions`, from the bracket of the size's
        grid of rates (and whatever the layout's searches before it probed)."""
        return SearchJob(
            name,
            (*self.fixed, f"workload.num_requests={size['requests']}"),
            tuple(conditions),
            label=f"{label}{self.key}",
            tolerance=size["tolerance"],
            max_probes=size["probes"],
            grid=tuple(size["grid"]),
            at=self.at,
            measure=measured,
        )


def searched(found: Found) -> dict[str, Any]:
    """A search as the tables read it."""
    r = found.result
    return {
        "slo": " and ".join(c.text for c in r.conditions),
        "rate": r.goodput,
        "status": r.status,
        "low": r.low,
        "high": r.high,
        "probes": len(r.probes),
    }


def run_searches(
    ctx: Context, jobs: dict[str, tuple[Layout, SearchJob]]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Every search by name, and each layout's curve (its runs by rate)."""
    found = ctx.search(BASE, [job for _, job in jobs.values()])
    results, curves = {}, {}
    for (name, (layout, _)), f in zip(jobs.items(), found, strict=True):
        results[name] = {"layout": layout.key, **searched(f)}
        curves[layout.name] = curve(f.runs)
    return results, curves


def colocated_searches(
    layout: Layout, size: dict[str, Any], label: str
) -> dict[str, tuple[Layout, SearchJob]]:
    """A colocated GPU's four searches: each percentile alone, both, the attainment form."""
    ttft, tpot = percentile_slo()
    forms = {
        "colocated_ttft": [ttft],
        "colocated_tpot": [tpot],
        "colocated_goodput": [ttft, tpot],
        "colocated_attainment": attainment_slo(),
    }
    return {k: (layout, layout.search(k, c, size, label)) for k, c in forms.items()}


def measure_all(
    ctx: Context, size: dict[str, Any], costs: dict[str, tuple[str, ...]], label: str
) -> dict[str, Any]:
    """Every layout's grid and searches under one set of step costs (`costs`: extra
    overrides for the colocated GPU and for the disaggregated ones)."""
    colo, disagg = costs["colocated"], costs["disaggregated"]
    prefill_only = Layout("prefill-only", "prefill_only", (*disagg, *PREFILL_ONLY))
    p2d1 = Layout("2P1D", "p2d1", (*disagg, *roles(2, 1)))
    ttft, tpot = percentile_slo()
    jobs = colocated_searches(Layout("colocated", "colocated", colo), size, label)
    jobs["prefill_only"] = (prefill_only, prefill_only.search("prefill_only", [ttft], size, label))
    jobs["p2d1"] = (p2d1, p2d1.search("p2d1", [ttft, tpot], size, label))
    jobs["p2d1_attainment"] = (p2d1, p2d1.search("p2d1_attainment", attainment_slo(), size, label))
    s, curves = run_searches(ctx, jobs)
    prefill = s["prefill_only"]["rate"]
    check_1p1d: dict[str, Any] | None = None
    if prefill is not None:

        def fed(rate: float) -> tuple[str, ...]:
            return (*roles(prefills_for(rate, prefill), 1), *rate_override(rate))

        decode = Layout("decode-only", "decode_only", disagg, fed)
        one_search = {"decode_only": (decode, decode.search("decode_only", [tpot], size, label))}
        found, more = run_searches(ctx, one_search)
        s |= found
        curves |= more
        if s["decode_only"]["rate"] is not None:
            s["decode_only"]["prefill_gpus"] = prefills_for(s["decode_only"]["rate"], prefill)
        one = Layout("1P1D", "1p1d", (*disagg, *roles(1, 1))).search("1p1d", [ttft], size, label)
        (run,) = ctx.run(BASE, [one.job(prefill)])
        check_1p1d = {"rate": prefill, "ttft_p90_s": run.metrics["ttft_p90_s"]}
        at = next(p for p in curves["prefill_only"] if p["rate"] == prefill)
        check_1p1d["prefill_only_ttft_p90_s"] = at["ttft_p90_s"]
    return {"searches": s, "curves": curves, "check_1p1d": check_1p1d, "rates": rates_of(s)}


def measure_colocated(
    ctx: Context, size: dict[str, Any], over: tuple[str, ...], label: str
) -> dict[str, Any]:
    """The colocated GPU alone, its grid and searches, under the step costs `over` sets."""
    layout = Layout("colocated", "colocated", over)
    s, curves = run_searches(ctx, colocated_searches(layout, size, label))
    return {"searches": s, "curves": curves, "rates": rates_of(s)}


def rates_of(s: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The cells' simulated values from the searches: rates, the 2P1D per GPU (measured and
    computed as the blog does) and the ratio of per-GPU goodputs."""
    rate = {k: v["rate"] for k, v in s.items()}
    prefill, decode = rate.get("prefill_only"), rate.get("decode_only")
    p2d1 = rate.get("p2d1")
    colo = rate.get("colocated_goodput")
    out = {k: rate.get(k) for k in ("colocated_ttft", "colocated_tpot", "colocated_goodput")}
    out["prefill_only"], out["decode_only"] = prefill, decode
    out["p2d1_per_gpu"] = p2d1 / 3 if p2d1 is not None else None
    out["p2d1_computed"] = (
        min(2 * prefill, decode) / 3 if prefill is not None and decode is not None else None
    )
    out["ratio"] = out["p2d1_per_gpu"] / colo if out["p2d1_per_gpu"] and colo else None
    att, att2 = rate.get("colocated_attainment"), rate.get("p2d1_attainment")
    out["colocated_attainment"] = att
    out["p2d1_attainment_per_gpu"] = att2 / 3 if att2 is not None else None
    out["ratio_attainment"] = out["p2d1_attainment_per_gpu"] / att if att and att2 else None
    return out


def curve(runs: dict[float, JobOutcome]) -> list[dict[str, Any]]:
    """A layout's runs in rate order, the numbers its figure and tables read."""
    keys = (
        "ttft_p90_s",
        "tpot_p90_s",
        ATTAINMENT,
        "mean_rows",
        "requests_finished",
        "prefill_step_s",
        "decode_step_s",
        "decode_step_rows",
    )
    return [{"rate": r, **{k: runs[r].metrics.get(k) for k in keys}} for r in sorted(runs)]


def diagnosis_profiles(ctx: Context) -> tuple[dict[str, Path] | None, str]:
    """DistServe's fitted step costs as profile files in the report's folder, or None and
    why not: they are OPT-13B's in fp16 on one A100-80GB, so a run the user moved off that
    is not diagnosed."""
    cfg = ctx.config(BASE)
    reasons = []
    if Path(str(cfg.model.path)).resolve() != OPT_13B.resolve():
        reasons.append(f"model.path={cfg.model.path}")
    if cfg.dtype != "float16":
        reasons.append(f"dtype={cfg.dtype}")
    if cfg.executor.hardware != "a100-80gb":
        reasons.append(f"executor.hardware={cfg.executor.hardware}")
    if int(cfg.executor.tensor_parallel) != 1 or cfg.executor.profile is not None:
        reasons.append("a tensor-parallel degree or profile of the user's")
    if reasons:
        return None, (
            "not run: DistServe's fits are OPT-13B's, fp16, one A100-80GB; this run has "
            + ", ".join(reasons)
        )
    return write_profiles(ctx.out / "profiles"), ""


def diagnose(ctx: Context, size: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The searches again on DistServe's fits: as its simulator prices its comparison
    (vLLM's fit on the colocated GPU, DistServe's own on the disaggregated ones), then the
    colocated GPU on DistServe's own fit too, so that one engine serves both layouts."""
    if not size["diagnosis"]:
        return None, "not run (quick form)"
    paths, skipped = diagnosis_profiles(ctx)
    if paths is None:
        return None, skipped
    vllm, own = f"executor.profile={paths['vllm']}", f"executor.profile={paths['distserve']}"
    profiled = measure_all(ctx, size, {"colocated": (vllm,), "disaggregated": (own,)}, "fits ")
    same = measure_colocated(ctx, size, (own,), "fits, one engine ")
    colo = same["rates"]["colocated_goodput"]
    per_gpu = profiled["rates"]["p2d1_per_gpu"]
    same["rates"]["ratio"] = per_gpu / colo if per_gpu and colo else None
    profiled["one_engine"] = same
    return profiled, ""


def reproduce(ctx: Context) -> Outcome:
    size = QUICK if ctx.quick else FULL
    analytic = measure_all(ctx, size, {"colocated": (), "disaggregated": ()}, "")
    profiled, skipped = diagnose(ctx, size)
    rates = analytic["rates"]
    return Outcome(
        cells=cells(rates),
        assumptions=assumptions(),
        setup=setup(ctx.quick, size),
        draw=lambda png: draw(png, analytic, profiled, PUBLISHED, FIRST_TTFT, (TTFT_S, TPOT_S)),
        config=ctx.config(BASE),
        paper_setup=PAPER,
        sections=[
            ("The rates, the two forms of the SLO, and the cross-checks", forms_section(analytic)),
            ("The result's shape, scale apart", shape_section(analytic, profiled, PUBLISHED)),
            ("Step costs: what moves the rates", costs_section(analytic, PUBLISHED)),
            (
                "With DistServe's own step costs",
                diagnosis_section(analytic, profiled, PUBLISHED, skipped),
            ),
        ],
        data={"analytic": analytic, "distserve_fits": profiled, "diagnosis_skipped": skipped},
    )
