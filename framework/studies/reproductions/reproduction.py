"""What a reproduction is given and what it gives back: the contract between the command
(`command.py`), the report (`report.py`) and each paper's module.

A reproduction module defines `reproduce(ctx: Context) -> Outcome`. It states its config as
Hydra overrides on `conf/` (a module constant), makes its runs with `ctx.run(base, jobs)`
and its capacity searches with `ctx.search(base, searches)` (the user's overrides are added
to every job there), and arranges their numbers the way the
paper's table or figure arranges them: cells, assumptions, the set-up, and a function that
draws the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from framework.run.compose import compose_cfg
from framework.studies.reproductions.cells import Assumption, Cell, PaperSetup
from framework.studies.reproductions.jobs import Job, JobOutcome, run_jobs
from framework.studies.reproductions.search import Found, SearchJob, search_all


@dataclass
class Context:
    """One invocation of a reproduction: `quick` asks for the small form (seconds, for the
    tests), `overrides` are the user's, `out` is where the report goes (a reproduction may
    write files of its own there), and `workers` how many jobs may run at once."""

    name: str
    quick: bool
    overrides: list[str]
    out: Path
    workers: int = 1
    jobs: list[JobOutcome] = field(default_factory=list)  # every job run, in order

    def run(self, base: Sequence[str], jobs: Sequence[Job]) -> list[JobOutcome]:
        """Run `jobs` on `base` with the user's overrides last; kept for the report."""
        done = run_jobs(base, jobs, self.overrides, self.workers)
        self.jobs.extend(done)
        return done

    def search(self, base: Sequence[str], searches: Sequence[SearchJob]) -> list[Found]:
        """Every search's capacity, in the order given (`search.py`: searches of one config
        share their runs, `workers` groups at once); every probe's job kept for the report."""
        found, jobs = search_all(base, searches, self.overrides, self.workers)
        self.jobs.extend(jobs)
        return found

    def config(self, base: Sequence[str]) -> DictConfig:
        """The config `base` and the user's overrides compose to: what the report logs."""
        return compose_cfg([*base, *self.overrides])


@dataclass
class Outcome:
    """A reproduction's result as the report writes it.

    `setup` (Markdown) says what ran; `sections` are further Markdown sections the paper's
    result needs (a comparison, what a number means); `draw` draws the paper's figure, the
    published points overlaid, into the path it is given; `data` is JSON-ready detail (the
    figure's series) for `reproduction.json`; `config` is the composed base config, whose
    values the MLflow run logs as params. `paper_setup`, where given, is what the paper's
    numbers were measured on: on any other set-up (the composed config differs) each cell's
    published value becomes the paper's, labelled, and no target (`PaperSetup.held_to`)."""

    cells: list[Cell]
    assumptions: list[Assumption]
    setup: str
    draw: Callable[[Path], None]
    config: DictConfig
    sections: list[tuple[str, str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    paper_setup: PaperSetup | None = None

    def __post_init__(self) -> None:
        if self.paper_setup is not None:
            self.cells = self.paper_setup.held_to(self.cells, self.config)
