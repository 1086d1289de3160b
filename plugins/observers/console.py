"""Console observer: each answer and the summary table at the end of a run, counts apart
from times (counts hold on any machine, times only on this one).

In a multirun (`-m`, an experiment) each job is one line instead, so a sweep reads at a
glance: `[2/4] scheduler=continuous allocator=incremental: 8 requests, makespan 1.23 s,
152.1 tokens/s`; the sweep's comparison table follows at its end (framework/tracking/
sweep_table.py). The line is written whole in one call, so lines of jobs running in
parallel processes (the joblib launcher) interleave, but never mix.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from framework.api import hookimpl
from framework.run.summary import COUNT_KEYS
from framework.tracking.sweep_table import read_plan
from framework.tracking.tags import PARENT_ENV, HydraJob, hydra_job, run_name


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _swept_from_env() -> list[str]:
    """The swept keys the sweep's MLflow callback passed on, if there is one."""
    try:
        return list(json.loads(os.environ[PARENT_ENV])["swept"])
    except (KeyError, ValueError, TypeError):
        return []


class ConsoleObserver:
    """Prints each answer and the run's counts and times (one line per job in a sweep)."""

    def __init__(self, cfg: Any) -> None:
        self.print_outputs = bool(cfg.get("print_outputs", True))
        self.print_limit: int | None = cfg.get("print_limit", None)
        self.console = Console()
        job = hydra_job()
        self.job: HydraJob | None = job if job is not None and job.multirun else None
        self.position = ""  # `[2/4]`, once known
        self.swept: list[str] = []

    # ---- a job of a multirun: one line ---------------------------------------------------
    def _sweep_position(self) -> None:
        """`[num+1/jobs]` and the swept keys, from the sweep folder's plan (any launcher);
        without one (another sweeper), the job number alone and the keys MLflow passed on."""
        assert self.job is not None
        plan = read_plan(self.job.sweep_dir)
        total = f"/{plan.jobs}" if plan is not None and plan.jobs else ""
        self.position = f"[{(self.job.num or 0) + 1}{total}]"
        self.swept = list(plan.swept) if plan is not None else _swept_from_env()

    def _line(self, run: Any, text: str) -> None:
        if not self.position:  # a run stopped before (or by) another observer's on_run_start
            self._sweep_position()
        label = run_name(run.config, self.job, self.swept)
        # tqdm.write: above the sweep's bar of runs when there is one, a plain line if not.
        tqdm.write(f"{self.position} {label}: {text}", file=sys.stdout)
        sys.stdout.flush()

    @staticmethod
    def _requests(summary: dict[str, Any]) -> str:
        total, done = summary.get("requests"), summary.get("requests_finished")
        if total is None:
            return "nothing measured"
        return f"{total} requests" if done == total else f"{done} of {total} requests finished"

    # ---- hooks ---------------------------------------------------------------------------
    @hookimpl
    def on_run_start(self, run: Any) -> None:
        if self.job is not None:
            self._sweep_position()
            return
        c = run.config
        what = "serving" if run.num_requests is None else f"{run.num_requests} requests"
        self.console.print(
            f"[bold]nanoserve[/]: {what} · scheduler={c.scheduler.name} "
            f"allocator={c.allocator.name} preemption={c.preemption.name} output={c.output.name} "
            f"model={c.model.source}"
        )

    @hookimpl
    def on_run_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self.job is not None:
            makespan = summary.get("makespan_s") or 0.0
            rate = summary.get("output_tokens_per_s") or 0.0
            self._line(
                run,
                f"{self._requests(summary)}, makespan {makespan:.3g} s, {rate:.1f} tokens/s",
            )
            return
        if self.print_outputs and run.result is not None:
            self._answers(run)
        counts = Table(title="counts (any machine)")
        # A simulated run's seconds were predicted from a profile, of this machine or not.
        simulated = summary.get("clock") == "virtual"
        times = Table(
            title=f"times (predicted: {summary.get('cost_model', '')} profile, virtual clock)"
            if simulated
            else "times (this machine)"
        )
        for t in (counts, times):
            t.add_column("metric")
            t.add_column("value", justify="right")
        for k, v in summary.items():
            if k == "replicas":  # a cluster's: a table of its own, below
                continue
            (counts if k in COUNT_KEYS else times).add_row(k, _fmt(v))
        self.console.print(counts)
        self.console.print(times)
        if summary.get("replicas"):
            self.console.print(self._replicas(summary["replicas"]))
        self.console.print(f"results in {run.output_dir}")

    @staticmethod
    def _replicas(rows: list[dict[str, Any]]) -> Table:
        """A cluster's replicas side by side: what each served and how fast."""
        keys = ("requests", "served_tokens", "steps", "prefix_hit_rate", "preemptions",
                "makespan_s", "ttft_p50_s", "tpot_p50_s")  # fmt: skip
        table = Table(title="replicas")
        table.add_column("replica")
        roles = "role" in rows[0]  # a cluster with replica roles (disaggregation)
        if roles:
            table.add_column("role")
        for k in keys:
            table.add_column(k, justify="right")
        for row in rows:
            role = [str(row["role"])] if roles else []
            table.add_row(str(row["replica"]), *role, *(_fmt(row.get(k)) for k in keys))
        return table

    def _answers(self, run: Any) -> None:
        """Each request's answer (or why it was rejected), the first `print_limit` of them."""
        seqs = run.result.seqs
        shown = seqs if self.print_limit is None else seqs[: self.print_limit]
        if str(run.config.executor.name) == "simulated":
            self.console.print(
                "[dim]executor=simulated: the answers are seeded token draws, not model output[/]"
            )
        for s in shown:
            if s.reject_reason:
                self.console.print(f"[red]{s.id} rejected[/]: {s.reject_reason}")
                continue
            prompt = (s.spec.prompt or "").strip().replace("\n", " ")
            if prompt:
                self.console.print(f"[bold cyan]{s.id}[/] [dim]{prompt[:100]}[/]")
            self.console.print(
                f"  {run.texts.get(s.id, '').strip()}  "
                f"[dim]({len(s.output_token_ids)} tokens, {s.finish_reason})[/]"
            )
        if len(shown) < len(seqs):
            self.console.print(
                f"[dim]... and {len(seqs) - len(shown):,} more answers in "
                f"{run.output_dir}/outputs.jsonl (print_limit={self.print_limit})[/]"
            )

    @hookimpl
    def on_run_abort(self, run: Any, error: BaseException, summary: dict[str, Any]) -> None:
        """In a sweep, the job still gets its line; alone, the error speaks for itself."""
        if self.job is not None:
            reason = summary.get("error") or type(error).__name__
            self._line(run, f"stopped, {self._requests(summary)}: {reason}")


@hookimpl
def register_observers(register) -> None:  # type: ignore[no-untyped-def]
    register("console", ConsoleObserver)
