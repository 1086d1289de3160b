"""A study whose every job is also searched for its goodput under an SLO:
`python run.py +experiment=disaggregation`.

Each job of the sweep is one run of its config at its `workload.rate`, with its folder and
MLflow run as any job's. When the sweep is done, `GoodputStudy` searches each job's
config for its goodput as DistServe defines it (`framework.studies.goodput`: the highest
request rate at which `attainment` of all the requests meet both the TTFT and the TPOT
target of its workload), on the simulator, and writes `NAME.md`, `NAME.csv` and `NAME.png`
at the top of the sweep folder, and `NAME.probes.csv`, every probe of every search with its
run's figures (the sweep's MLflow parent run uploads them all). A row of the table is a job:
its goodput and goodput per GPU; which target gave way first (at the lowest rate probed that
missed); and, from the run at the goodput, TTFT and TPOT p50/p90/p99, the KV transfers' p99,
and each pool's utilisation (its replicas' device-busy seconds over the run's makespan,
averaged over the pool).

The searches run in forked worker processes, one per core (`workers`): each probe is a
simulated run on a virtual clock under `executor.host_time=model`, so every figure is the
same however many run at once. A finished sweep's table can be written again, its searches
run again: `python -m experiments.goodput_study multirun/NAME/DATE`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from framework.run.compose import compose_cfg
from framework.run.errors import UserError
from framework.run.workers import cores, fork_map_as_done
from framework.studies.goodput_probes import BASE, Prober, check_config
from framework.studies.goodput_probes import COLUMNS as PROBE_FIGURES
from framework.studies.goodput_search import find_capacity
from framework.studies.slo import attainment_condition
from framework.studies.study_report import SweepStudy
from framework.studies.sweep_runs import check_same_work, load_sweep
from framework.tracking.plots import plot_bars
from framework.tracking.sweep_table import write_table
from framework.tracking.tables import job_folders, write_csv
from framework.tracking.tags import environment_tags

# The pools a replica's role puts it in, in the table's order.
POOLS = ("prefill", "decode", "mixed")
COLUMNS = (
    "workload", "layout", "gpus", "goodput_rps", "goodput_per_gpu_rps", "gives_way",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
    "kv_transfer_s_p99", "kv_wait_s_p99", *(f"{p}_util" for p in POOLS), "search", "probes",
)  # fmt: skip
# NAME.probes.csv: each search's every probe, the job's first.
PROBE_COLUMNS = (
    "job", "workload", "layout", *PROBE_FIGURES, "kv_transfer_s_p99", "kv_wait_s_p99",
)  # fmt: skip


@dataclass(frozen=True)
class Search:
    """One job's search: its overrides, the SLO of its workload, and where to start."""

    job: str
    workload: str
    layout: str
    overrides: list[str]
    ttft_s: float
    tpot_s: float
    low: float


@dataclass(frozen=True)
class Settings:
    """The study's parameters (the callback's config): the SLO per workload choice, and
    how the searches run."""

    slo: dict[str, tuple[float, float]]
    attainment: float = 0.9
    tolerance: float = 0.05
    growth: float = 2.0
    max_probes: int = 12
    low: float | None = None  # the first rate; None: each job's own workload.rate
    workers: int = 0  # 0: one per core


def settings(params: dict[str, Any]) -> Settings:
    """The callback's parameters, checked: an SLO is `[ttft_s, tpot_s]` per workload."""
    slo = {}
    for name, pair in (params.get("slo") or {}).items():
        ttft, tpot = (float(v) for v in pair)
        if not (ttft > 0 and tpot > 0):
            raise UserError(f"study slo.{name}: ttft_s and tpot_s must be > 0; got {pair}")
        slo[str(name)] = (ttft, tpot)
    keys = ("attainment", "tolerance", "growth", "max_probes", "low", "workers")
    return Settings(slo, **{k: params[k] for k in keys if params.get(k) is not None})


def job_searches(sweep_dir: Path, s: Settings) -> list[Search]:
    """Each job folder's search, from the overrides it ran with and its config choices."""
    searches = []
    for folder in job_folders(sweep_dir):
        hydra = OmegaConf.load(folder / ".hydra" / "hydra.yaml").hydra
        overrides = [str(o) for o in OmegaConf.load(folder / ".hydra" / "overrides.yaml")]
        choices = hydra.runtime.choices
        workload = str(choices.get("workload"))
        if workload not in s.slo:
            known = ", ".join(s.slo) or "none"
            raise UserError(
                f"study: no SLO for workload={workload} (job {folder.name}); the study's slo "
                f"has {known}: add hydra.callbacks.study.slo.{workload}=[TTFT_S,TPOT_S]"
            )
        cfg = compose_cfg([*BASE, *overrides])
        rate = check_config(cfg)
        searches.append(
            Search(
                folder.name,
                workload,
                str(choices.get("layout", "-")),
                overrides,
                *s.slo[workload],
                s.low if s.low is not None else rate,
            )
        )
    return searches


def run_search(search: Search, s: Settings) -> dict[str, Any]:
    """One job's goodput and the figures of the run at it (a worker process's task). The
    probes' run folders go to a temporary folder: the table keeps what they measured."""
    slo = (search.ttft_s, search.tpot_s)
    with tempfile.TemporaryDirectory() as runs, contextlib.redirect_stdout(io.StringIO()):
        prober = Prober([*BASE, *search.overrides], Path(runs), slo)
        prober.say = lambda text: None
        result = find_capacity(
            prober,
            [attainment_condition(s.attainment)],
            search.low,
            search.low * s.growth,
            tolerance=s.tolerance,
            growth=s.growth,
            max_probes=s.max_probes,
            on_probe=prober.record,
        )
    at = {row["rate_rps"]: i for i, row in enumerate(prober.rows)}
    best = prober.summaries[at[result.goodput]] if result.goodput in at else {}
    missed = [r for r in prober.rows if not r["met"]]
    first_miss = min(missed, key=lambda r: r["rate_rps"]) if missed else None
    gpus = int(best.get("cluster_replicas") or 1) * int(best.get("tensor_parallel") or 1)
    row: dict[str, Any] = {
        "workload": search.workload,
        "layout": search.layout,
        "gpus": gpus,
        "goodput_rps": result.goodput,
        "goodput_per_gpu_rps": result.goodput / gpus if result.goodput else None,
        "gives_way": gives_way(first_miss, s.attainment),
        **{k: best.get(k) for k in COLUMNS[6:14]},
        **pool_utilisation(best),
        "search": result.status,
        "probes": len(prober.rows),
        "ttft_slo_s": search.ttft_s,
        "tpot_slo_s": search.tpot_s,
        "profile": {k: best.get(k) for k in ("cost_model", "profile", "hardware")},
        "probe_rows": [
            {"job": search.job, "workload": search.workload, "layout": search.layout, **r}
            for r in prober.rows
        ],
    }
    return row


def gives_way(row: dict[str, Any] | None, target: float) -> str:
    """Which target fell short first: at the lowest rate that missed, `ttft`, `tpot` or
    `both` met by fewer than the target share; `-` when no probe missed."""
    if row is None:
        return "-"
    short = [k for k in ("ttft", "tpot") if row[f"{k}_met"] < target]
    return "both" if len(short) == 2 else (short[0] if short else "both together")


def pool_utilisation(summary: dict[str, Any]) -> dict[str, float | None]:
    """Each pool's utilisation: its replicas' mean `utilisation` (None: no such pool)."""
    rows = summary.get("replicas") or []
    out: dict[str, float | None] = {}
    for pool in POOLS:
        mine = [r["utilisation"] for r in rows if r.get("role", "mixed") == pool]
        out[f"{pool}_util"] = sum(mine) / len(mine) if mine else None
    return out


def search_all(searches: list[Search], s: Settings) -> list[dict[str, Any]]:
    """Every job's search, on `workers` forked processes (the rows in job order)."""
    workers = max(1, min(s.workers or cores(), cores(), len(searches)))
    print(
        f"searching {len(searches)} jobs for their goodput, {workers} at a time",
        file=sys.stderr,
        flush=True,
    )
    rows: dict[int, dict[str, Any]] = {}
    for i, row in fork_map_as_done(lambda x: run_search(x, s), searches, workers):
        rows[i] = announce(searches[i], row)
    return [rows[i] for i in range(len(searches))]


def announce(search: Search, row: dict[str, Any]) -> dict[str, Any]:
    """A line on stderr as each search ends (a whole study takes minutes); the row back."""
    goodput = "none" if row["goodput_rps"] is None else f"{row['goodput_rps']:.4g} req/s"
    print(
        f"job {search.job} ({search.workload}, {search.layout}): goodput {goodput} "
        f"({row['search']}, {row['probes']} probes)",
        file=sys.stderr,
        flush=True,
    )
    return row


def write_report(
    name: str, title: str, rows: list[dict[str, Any]], s: Settings, out: Path, seconds: float
) -> Path:
    """`NAME.md`, `NAME.csv` and `NAME.png` in `out`; returns the Markdown file."""
    tags = environment_tags()
    profile = rows[0]["profile"] if rows else {}
    slo = "; ".join(f"{w}: TTFT <= {t:g} s, TPOT <= {p:g} s" for w, (t, p) in s.slo.items())
    heading = (
        f"Simulated {time.strftime('%Y-%m-%d')} (executor=simulated, virtual clock, "
        f"{profile.get('cost_model')} profile {profile.get('profile')}, hardware "
        f"{profile.get('hardware')}; computed on {tags['machine.cpu']} in {seconds:.0f} s), "
        f"commit {tags['git.commit'][:10]}. Every time is the profile's prediction for the "
        "GPU it names, not a measurement."
    )
    note = (
        f"goodput_rps: the highest request rate probed at which at least {s.attainment:g} of "
        f"all requests met both targets ({slo}); found by bisection on workload.rate to "
        f"within {s.tolerance:g} (search: converged, budget: out of probes, above: every "
        "probe met, below: none did). gives_way: the target met by fewer than that share at "
        "the lowest rate that missed (both together: each alone was met by that share, "
        "not both by the same requests). The latencies, transfers and utilisations are those "
        "of the run at the goodput. *_util: a pool's replicas' device-busy seconds over "
        "the makespan, averaged over the pool (empty: no such pool). kv_transfer_s_p99: "
        "from the reservation to the last byte landed; kv_wait_s_p99: a request's wait at "
        "its prefill replica for a decode replica's blocks. Every probe of every search, "
        f"with its run's figures: {name}.probes.csv."
    )
    md = write_table(out, name, rows, COLUMNS, title, note, heading)
    for r in rows:
        r["run"] = f"{r['workload']} / {r['layout']}"
    drawn = ["goodput_rps", "ttft_p99_s", "tpot_p99_s", "kv_transfer_s_p99"]
    plot_bars(rows, "run", drawn, out / f"{name}.png", title)
    return md


def study(name: str, title: str, sweep_dir: Path, params: dict[str, Any]) -> Path:
    """Check that the jobs of each workload did the same work (the same tokens for every
    request, whatever the layout: `DifferentWork` otherwise), search each job, write the
    table."""
    s = settings(params)
    searches = job_searches(sweep_dir, s)
    if not searches:
        raise FileNotFoundError(f"{sweep_dir}: no job folders")
    check_same_work(load_sweep(sweep_dir), lambda run: OmegaConf.to_yaml(run.config.workload))
    began = time.perf_counter()
    rows = search_all(searches, s)
    probes = [probe for row in rows for probe in row.pop("probe_rows")]
    write_csv(probes, PROBE_COLUMNS, sweep_dir / f"{name}.probes.csv")
    return write_report(name, title, rows, s, sweep_dir, time.perf_counter() - began)


class GoodputStudy(SweepStudy):
    """Hydra callback (`hydra.callbacks.study`): each job's goodput, once the sweep is
    done. Its config's other fields are the study's parameters (`Settings`)."""

    def __init__(self, name: str, title: str, **params: Any) -> None:
        super().__init__(name, **params)
        self.title = title

    def write(self, sweep_dir: Path, params: dict[str, Any]) -> Path:
        return study(self.name, self.title, sweep_dir, params)


def main(argv: list[str] | None = None) -> Path:
    """A finished sweep's goodput table, written again: its experiment's study settings
    are read from the sweep's own Hydra config."""
    ap = argparse.ArgumentParser(
        description="A finished sweep's goodput table, its searches run again."
    )
    ap.add_argument("sweep_dir", type=Path, help="the sweep's folder (multirun/NAME/DATE)")
    args = ap.parse_args(argv)
    hydra = OmegaConf.load(args.sweep_dir / "multirun.yaml").hydra
    block = OmegaConf.to_container(hydra.callbacks.study, resolve=False)
    assert isinstance(block, dict)  # the callback's settings, a mapping in multirun.yaml
    conf = {str(k): v for k, v in block.items()}  # YAML's keys: strings already
    conf.pop("_target_")
    name, title = conf.pop("name"), conf.pop("title")
    md = study(name, title, args.sweep_dir, conf)
    print(md.read_text())
    return md
