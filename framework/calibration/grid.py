"""The calibration grid: the step shapes a profile is fitted on and judged by. Each point is
a `fixed` workload, every request at t=0, served with continuous batching, so its steps are
the same on every run; some points are held out, whole configurations the fit never sees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from framework.run.paths import DEFAULT_TRACE
from framework.workloads.trace import read_trace

SAMPLED = {"temperature": 0.7, "top_p": 0.9}  # the grid's sampled (random) requests


def fit_lengths(lengths: list[int], cap: int, how: str) -> list[int]:
    """Lengths brought under `cap`: `scale` multiplies all by cap / longest (the mix keeps
    its proportions), `clamp` cuts only those above; at least 1 token each. The benchmark's
    queued slice of the Azure trace is scaled so too, and the grid holds its shapes."""
    longest = max(lengths)
    if how == "scale" and longest > cap:
        return [max(1, round(n * cap / longest)) for n in lengths]
    return [max(1, min(n, cap)) for n in lengths]


@dataclass(frozen=True)
class Point:
    """One configuration: a fixed workload, every request at t=0, and its batch limits."""

    name: str
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    max_num_seqs: int
    holdout: bool = False
    sampled: bool = False  # temperature > 0: the sampler's random path


def decode(n: int, p: int, out: int, holdout: bool = False, sampled: bool = False) -> Point:
    """n rows decoding together at context p..p+out, after their prefill."""
    kind = "sampled" if sampled else "decode"
    return Point(f"{kind}-{n}x{p}", (p,) * n, (out,) * n, n, holdout, sampled)


def mixed(n: int, p: int, waves: int = 2, holdout: bool = False) -> Point:
    """waves x n requests through n slots, output lengths staggered (3 to about 27) so that
    rows finish a few at a time and each newcomer's prefill shares a step with the others'
    decodes."""
    outs = tuple(3 + (i % n) * 24 // n + i // n for i in range(waves * n))
    return Point(f"mixed-{n}x{p}", (p,) * (waves * n), outs, n, holdout)


def trace(
    tok_rows: list[tuple[int, int]],
    name: str,
    n: int,
    max_prompt: int,
    max_output: int,
    holdout: bool = False,
) -> Point:
    """A slice of the Azure conversation trace, lengths scaled as the benchmark scales them
    (`fit_lengths`), all queued at t=0 through n slots."""
    prompts = fit_lengths([c for c, _ in tok_rows], max_prompt, "scale")
    outputs = fit_lengths([g for _, g in tok_rows], max_output, "scale")
    return Point(name, tuple(prompts), tuple(outputs), n, holdout)


def trace_rows(start: int, count: int) -> list[tuple[int, int]]:
    if not DEFAULT_TRACE.is_file():
        return []
    return [(r.context_tokens, r.generated_tokens) for r in read_trace(DEFAULT_TRACE, start, count)]


def full_grid() -> list[Point]:
    """SmolLM2-sized: minutes a pass on a small CPU, the prefills most of it. Each tuple is
    (rows, prompt length, output length)."""
    short = [(n, 16, 10) for n in (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)]
    long = [(1, 1024, 10), (1, 2048, 6), (4, 512, 10), (2, 1024, 8), (8, 256, 10)]
    long += [(8, 512, 8), (32, 128, 10)]
    prompts = [(2, 384, 4), (8, 64, 4), (1, 160, 4), (3, 700, 3)]
    points = [decode(*x) for x in short + long + prompts]
    points += [mixed(n, p) for n, p in ((4, 64), (8, 32), (8, 128), (16, 48), (24, 24), (4, 384))]
    points += [decode(8, 16, 12, sampled=True), decode(32, 16, 8, sampled=True)]
    # Held out: interior points of each family, never fitted.
    held = [(10, 16, 10), (28, 16, 10), (2, 768, 8), (12, 256, 8), (5, 200, 4)]
    points += [decode(*x, holdout=True) for x in held]
    points += [mixed(12, 64, holdout=True), mixed(6, 256, holdout=True)]
    points += [decode(16, 16, 10, sampled=True, holdout=True)]
    rows = trace_rows(0, 48)
    if rows:  # the shapes of the benchmark's queued slice: one slice fitted, one held out
        points.append(trace(rows[24:48], "azure-24-48", 16, 128, 32))
        points.append(trace(rows[:24], "azure-0-24", 16, 128, 32, holdout=True))
    return points


def cuda_grid() -> list[Point]:
    """The CPU grid, and the sizes where a GPU only starts to work: up to 256 rows and
    8k-token prefills."""
    more = [(128, 16, 10), (256, 16, 8), (64, 512, 8), (128, 256, 6), (4, 2048, 6)]
    held = [decode(96, 16, 10, holdout=True), decode(32, 1024, 6, holdout=True)]
    return [*full_grid(), *(decode(*x) for x in more), mixed(64, 64), mixed(128, 32), *held]


def brief_cuda_grid() -> list[Point]:
    """A GPU's profile in a minute or so (the simulator check's GPU mode): decode widths of
    1 to 64 rows, prompts of 128 to 2k tokens, mixed steps and sampled rows; two held out."""
    fitted = [decode(n, 16, 8) for n in (1, 4, 16, 64)]
    fitted += [decode(8, 128, 6), decode(4, 256, 4), decode(1, 512, 4), decode(1, 2048, 3)]
    fitted += [mixed(8, 32), mixed(16, 64), decode(8, 16, 6, sampled=True)]
    return [*fitted, decode(24, 16, 8, holdout=True), mixed(6, 128, holdout=True)]


def quick_grid() -> list[Point]:
    """For tests on the tiny model: a handful of runs, a few seconds."""
    fitted = [decode(1, 8, 5), decode(4, 16, 5), decode(8, 8, 4), decode(2, 64, 4), mixed(4, 16)]
    held = [decode(3, 24, 4, holdout=True), mixed(3, 12, holdout=True)]
    return [*fitted, decode(4, 8, 4, sampled=True), *held]


def workload(point: Point, seed: int) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "kind": "fixed",
        "prompt_lens": list(point.prompt_lens),
        "output_lens": list(point.output_lens),
        "seed": seed,
    }
    return wl | (SAMPLED if point.sampled else {})


# One request's five 1-row decode steps: every weight read once, as bandwidth-bound as a
# step gets. The simulator check times the same probe against the profile's.
CANARY = Point("canary", (16,), (6,), 1)
# One 128-token prompt's prefill, mostly the Linear layers' arithmetic: the compute-bound
# probe beside it (`fit.prefill_canary_best_s`). A shared VM's neighbours slow the two apart.
PREFILL_CANARY = Point("canary-prefill", (128,), (1,), 1)
