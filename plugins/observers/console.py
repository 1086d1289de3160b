"""Console observer: each answer and the summary table at the end of a run, counts apart
from times (counts hold on any machine, times only on this one)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from framework.api import hookimpl
from framework.run.summary import COUNT_KEYS


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class ConsoleObserver:
    def __init__(self, cfg: Any) -> None:
        self.print_outputs = bool(cfg.get("print_outputs", True))
        self.console = Console()

    @hookimpl
    def on_run_start(self, run: Any) -> None:
        c = run.config
        self.console.print(
            f"[bold]nanoserve[/]: {run.num_requests} requests · scheduler={c.scheduler.name} "
            f"allocator={c.allocator.name} preemption={c.preemption.name} output={c.output.name} "
            f"model={c.model.source}"
        )

    @hookimpl
    def on_run_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self.print_outputs and run.result is not None:
            for s in run.result.seqs:
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
        counts = Table(title="counts (any machine)")
        times = Table(title="times (this machine)")
        for t in (counts, times):
            t.add_column("metric")
            t.add_column("value", justify="right")
        for k, v in summary.items():
            (counts if k in COUNT_KEYS else times).add_row(k, _fmt(v))
        self.console.print(counts)
        self.console.print(times)
        self.console.print(f"results in {run.output_dir}")


@hookimpl
def register_observers(register) -> None:  # type: ignore[no-untyped-def]
    register("console", ConsoleObserver)
