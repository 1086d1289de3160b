"""A reproduction's capacity searches: the highest rate at which a config meets an SLO, found
by `goodput_search.find_capacity`, each probe a job of `jobs.py`.

A search's probes depend on the ones before, so the searches, not their probes, are what run
side by side: searches of the same config (`SearchJob.key`: the same overrides, the same
rate rule, the same measure) form a group that shares its runs, so that a rate one search
probed is not run again for another (a system searched under two SLOs), and the groups run
`workers` at a time through the project's fork pool, each probe in its group's process.
A search may start from a grid of rates: the grid's runs of every group go first, as one
batch of jobs (`workers` at once), and each search then starts from the bracket they give.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from framework.engine.loop import RunResult
from framework.run.workers import fork_map
from framework.studies.goodput_search import CapacityResult, find_capacity
from framework.studies.reproductions.jobs import Job, JobOutcome, check_jobs, run_jobs
from framework.studies.slo import Condition, check


def rate_override(rate: float) -> tuple[str, ...]:
    """A probe's rate: the workload's Poisson rate."""
    return (f"workload.rate={rate!r}",)


@dataclass(frozen=True)
class SearchJob:
    """One capacity search. `overrides` are the searched config's own; `at(rate)` the
    overrides of a probe at `rate` (the workload's rate by default; a rule of the rate, such
    as a cluster sized for it, goes here too); `label` names its probes' jobs ("LABEL 2.5
    req/s"); `grid`, rates run before the search, whose bracket it starts from (`low` and
    `high` where none is given). The rest are `find_capacity`'s."""

    name: str
    overrides: tuple[str, ...]
    conditions: tuple[Condition, ...]
    label: str = ""
    low: float = 1.0
    high: float | None = None
    tolerance: float = 0.05
    growth: float = 2.0
    max_probes: int = 20
    grid: tuple[float, ...] = ()
    at: Callable[[float], tuple[str, ...]] = rate_override
    measure: Callable[[RunResult], dict[str, Any]] | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """What a probe's config depends on: searches of one key share their runs."""
        return (self.overrides, self.at, self.measure)

    def job(self, rate: float) -> Job:
        """The probe of this search's config at `rate`."""
        name = f"{self.label or self.name} {rate:.4g} req/s"
        return Job(name, (*self.overrides, *self.at(rate)), self.measure)


@dataclass
class Found:
    """A search's result: `result` as `find_capacity` gives it; `probes` the jobs behind its
    probes, in the order probed; `runs` every run of its group by rate (the grid's, its own
    and its group's other searches': a figure's curve)."""

    search: SearchJob
    result: CapacityResult
    probes: list[JobOutcome] = field(default_factory=list)
    runs: dict[float, JobOutcome] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return self.result.goodput


def bracket(
    runs: dict[float, JobOutcome], conditions: Sequence[Condition], low: float, high: float | None
) -> tuple[float, float | None]:
    """Where a search starts: the highest rate run that met the SLO below the lowest that
    missed it, and that one (None: none missed); none met: half the lowest rate run. No
    runs: `low` and `high` as given."""
    rates = sorted(runs)
    if not rates:
        return low, high
    met = {r: all(c.passed for c in check(conditions, runs[r].metrics)) for r in rates}
    missed = [r for r in rates if not met[r]]
    first_miss = missed[0] if missed else None
    below = [r for r in rates if met[r] and (first_miss is None or r < first_miss)]
    if not below:
        return rates[0] / 2, rates[0]
    return below[-1], first_miss


def search_all(
    base: Sequence[str], searches: Sequence[SearchJob], user: Sequence[str], workers: int
) -> tuple[list[Found], list[JobOutcome]]:
    """Every search's result, in the order given, and every job run (the grid's first, then
    each group's probes, group by group). Every search's config is checked first: a user's
    mistake is one `UserError` before anything runs."""
    check_jobs(base, [s.job(s.low) for s in searches], user)
    groups: dict[tuple[Any, ...], list[SearchJob]] = {}
    for s in searches:
        groups.setdefault(s.key, []).append(s)
    members = list(groups.values())
    plan = [(i, rate) for i, g in enumerate(members) for rate in _grid(g)]
    ran = run_jobs(base, [members[i][0].job(rate) for i, rate in plan], user, workers)
    seeded: list[dict[float, JobOutcome]] = [{} for _ in members]
    for (i, rate), outcome in zip(plan, ran, strict=True):
        seeded[i][rate] = outcome

    def one_group(index: int) -> _Searched:
        return _search_group(base, members[index], user, seeded[index])

    found: dict[int, Found] = {}
    jobs = list(ran)
    done = fork_map(one_group, range(len(members)), workers, fresh=True)
    for group, (results, probed, runs) in zip(members, done, strict=True):
        for s, (result, own) in zip(group, results, strict=True):
            found[id(s)] = Found(s, result, own, runs)
        jobs += probed
    return [found[id(s)] for s in searches], jobs


# A group searched, as a worker sends it back (no search job in it: a job's rules are
# functions, which need not pickle): each search's result and probes, the jobs it ran, and
# every run of the group by rate.
_Searched = tuple[
    list[tuple[CapacityResult, list[JobOutcome]]], list[JobOutcome], dict[float, JobOutcome]
]


def _grid(group: list[SearchJob]) -> list[float]:
    """The group's grid: every rate any of its searches asks for, in the order first asked."""
    return list(dict.fromkeys(rate for s in group for rate in s.grid))


def _search_group(
    base: Sequence[str],
    group: list[SearchJob],
    user: Sequence[str],
    runs: dict[float, JobOutcome],
) -> _Searched:
    """A group's searches one after another in this process, sharing `runs` by rate."""
    probed: list[JobOutcome] = []
    results = []
    for s in group:
        own: list[JobOutcome] = []

        def probe(rate: float, s: SearchJob = s, own: list[JobOutcome] = own) -> Any:
            if rate not in runs:
                (runs[rate],) = run_jobs(base, [s.job(rate)], user, 1)
                probed.append(runs[rate])
            own.append(runs[rate])
            return runs[rate].metrics

        low, high = bracket(runs, s.conditions, s.low, s.high) if s.grid else (s.low, s.high)
        result = find_capacity(
            probe,
            s.conditions,
            low=low,
            high=high,
            tolerance=s.tolerance,
            growth=s.growth,
            max_probes=s.max_probes,
        )
        results.append((result, own))
    return results, probed, runs
