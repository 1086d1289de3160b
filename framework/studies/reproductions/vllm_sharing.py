"""vLLM's memory sharing inside one request (SOSP 2023, section 6.3, Figs. 14-15), for OPT-13B
on one A100-40GB with 12 GB of KV: parallel sampling's samples over one copy of the prompt.

Fig. 15, the memory saving: each request of the Alpaca trace asks for `n` = 2, 4 or 6 samples
(`sampling.n`), served by the simulated vLLM (vLLM 0.1's software and caps, as
`vllm_batching`; blocks of 16 tokens) at the artifact's 20 requests/s (`fig15.sh`). The saving
is the paper's: "the number of blocks we saved by sharing divided by the number of total
blocks without sharing", which the artifact computes as 1 - 1 / the mean over time of the
logical blocks over the physical ones; here `kv_sharing_saving`, the same ratio time-weighted
over the run (`framework.engine.kv_usage`). The text gives ShareGPT's savings as a range only
(16.2-30.5%): run at 2 and 6 samples, at Fig. 13's ShareGPT rate, 2 requests/s.

Fig. 14, the throughput: each system's sustainable Alpaca rate with `n` samples (the highest
Poisson rate, held for a fixed time, at which the mean normalized latency stays within
`BOUND`), vLLM against Orca
(Oracle), whose extents share nothing (`engine.kv_layout=contiguous`). The paper prints no
number for parallel sampling; its text says vLLM's lead over Orca grows with the samples.

Beam search (Fig. 15's second row, the text's ShareGPT range): a beam's hypotheses are its
model's own, so these cells run the engine's beam search (`sampling.beam_width`) on a real
model, SmolLM2-135M in fp32 on this machine's CPU (the tiny random Llama under `--quick`),
over corpus prose at the same lengths, with the same blocks and policies: the saving of a
100x smaller model's beams, measured, not simulated. Fig. 14's beam-search throughput is not
run (the simulator has no logits to rank beams by).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from framework.studies.reproductions.cells import Assumption, Cell
from framework.studies.reproductions.jobs import Job, JobOutcome
from framework.studies.reproductions.reproduction import Context, Outcome
from framework.studies.reproductions.search import SearchJob
from framework.studies.reproductions.vllm_batching import BASE as BATCHING_BASE
from framework.studies.reproductions.vllm_batching import PAPER, PAPER_MEANS, SHAREGPT, SYSTEMS
from framework.studies.reproductions.vllm_lengths import drawn_pairs, sharegpt_pairs, write_lengths
from framework.studies.slo import parse_condition
from framework.tracking.figures import save_figure
from framework.tracking.tables import markdown_table

SAMPLES = (2, 4, 6)
ALPACA_RATE = 20.0  # requests/s: the artifact's Fig. 15 (fig15.sh)
SHAREGPT_RATE = 2.0  # requests/s: Fig. 13's ShareGPT rate; the paper states none for this
BOUND = 0.5  # s/token: the normalized latency a sustainable rate keeps to (as vllm_batching)
MAX_RATE = 32.0  # requests/s: the highest a capacity search probes (the artifact's reach 20)

# What is published (section 6.3 and Fig. 15's bar labels, read by two third parties who agree
# to 0.01; the text rounds them to "6.1% - 9.8%" and "37.6% - 55.2%").
FIG15 = "Fig. 15's bar labels (the text: 6.1-9.8% parallel, 37.6-55.2% beam)"
TEXT = "section 6.3, text: ShareGPT, a range over the three settings"
PARALLEL = {2: 6.09, 4: 8.53, 6: 9.79}  # %, Alpaca
BEAM = {2: 37.56, 4: 53.13, 6: 55.16}  # %, Alpaca
SHAREGPT_PARALLEL = (16.2, 30.5)  # %, its ends read as 2 and 6 samples
SHAREGPT_BEAM = (44.3, 66.3)
# End of the published data.

VLLM = ("scheduler=prefill_first", "allocator=incremental", "engine.block_size=16")
ORCA = SYSTEMS["Orca (Oracle)"]
BASE = (*BATCHING_BASE, "observers=[]")


def sizes(quick: bool) -> dict[str, int]:
    """Requests of each run; a capacity probe's arrivals last `seconds` at its rate; the
    requests of a beam-search run on the model (Alpaca's, ShareGPT's)."""
    if quick:
        return {"alpaca": 200, "sharegpt": 40, "seconds": 10, "probes": 2, "beam_alpaca": 3,
                "beam_sharegpt": 1}  # fmt: skip
    return {"alpaca": 4000, "sharegpt": 600, "seconds": 60, "probes": 8, "beam_alpaca": 24,
            "beam_sharegpt": 8}  # fmt: skip


def beam_base(quick: bool) -> tuple[str, ...]:
    """A beam search on the model executor, on this machine: vLLM's blocks and policies,
    every request's beams side by side, corpus prose at the trace's lengths."""
    return (
        "model=tiny" if quick else "model=smollm2",
        "executor=model",
        "dtype=float32",
        "workload=trace",
        "workload.arrival=burst",
        "engine.max_num_seqs=64",
        "engine.max_num_batched_tokens=2048",
        "observers=[]",
        *VLLM,
    )


def probe_at(seconds: float, rate: float) -> tuple[str, ...]:
    """A capacity probe at `rate`: Poisson arrivals for `seconds`, so that a high rate is
    held as long as a low one (a fixed count of requests would pass in a burst too short to
    build a queue)."""
    return (f"workload.rate={rate!r}", f"workload.limit={max(20, round(rate * seconds))}")


def reproduce(ctx: Context) -> Outcome:
    size = sizes(ctx.quick)
    folder = ctx.out / "lengths"
    # Enough for a capacity probe at up to `MAX_RATE` requests/s; Fig. 15's runs take the first.
    count = max(size["alpaca"], round(MAX_RATE * size["seconds"]))
    alpaca = write_lengths(folder / "alpaca.csv", drawn_pairs(count, *PAPER_MEANS["alpaca"], cv=1))
    sharegpt = write_lengths(folder / "sharegpt.csv", sharegpt_pairs(SHAREGPT)[: size["sharegpt"]])
    jobs = [
        Job(f"alpaca n={n}", (*VLLM, f"workload.path={alpaca}", f"workload.limit={size['alpaca']}",
                              f"workload.rate={ALPACA_RATE}", f"workload.n={n}"))
        for n in SAMPLES
    ] + [
        Job(f"sharegpt n={n}", (*VLLM, f"workload.path={sharegpt}",
                                f"workload.limit={size['sharegpt']}",
                                f"workload.rate={SHAREGPT_RATE}", f"workload.n={n}"))
        for n in (2, 6)
    ]  # fmt: skip
    done = {j.name: j for j in ctx.run(BASE, jobs)}
    beams = [
        Job(f"{trace} beam width {w}", (f"workload.path={path}",
                                        f"workload.limit={size['beam_' + trace]}",
                                        f"workload.beam_width={w}"))
        for trace, path, widths in (("alpaca", alpaca, SAMPLES), ("sharegpt", sharegpt, (2, 6)))
        for w in widths
    ]  # fmt: skip
    done.update({j.name: j for j in ctx.run(beam_base(ctx.quick), beams)})
    saving = {name: 100 * float(j.metrics["kv_sharing_saving"]) for name, j in done.items()}
    capacity = capacities(ctx, alpaca, size)
    cells = cells_of(saving)
    sections = [
        ("Fig. 15: memory saved by sharing", _saving_table(done)),
        (f"Fig. 14: sustainable Alpaca rate, normalized latency <= {BOUND:g} s/token",
         _capacity_table(capacity)),
    ]  # fmt: skip
    setup = (
        f"Alpaca lengths drawn lognormal (cv 1) at the paper's means, {size['alpaca']} "
        f"requests at {ALPACA_RATE:g} requests/s; the first {size['sharegpt']} kept ShareGPT "
        f"conversations at {SHAREGPT_RATE:g} requests/s; each request `n` samples, Poisson "
        f"arrivals, on the simulated A100-40GB under vLLM 0.1's software and caps: "
        f"`{' '.join((*BASE, *VLLM))}`. Beam search: the first {size['beam_alpaca']} Alpaca and "
        f"{size['beam_sharegpt']} ShareGPT requests at once, each `beam_width` beams, on the "
        f"model executor on this machine's CPU: `{' '.join(beam_base(ctx.quick))}`"
    )
    return Outcome(
        cells=cells,
        assumptions=ASSUMPTIONS,
        setup=setup,
        draw=lambda png: draw(png, saving, capacity),
        config=ctx.config([*BASE, *VLLM]),
        sections=sections,
        data={"saving_percent": saving, "capacity": capacity,
              "runs": {n: j.metrics for n, j in done.items()}},
        paper_setup=PAPER,
    )  # fmt: skip


def capacities(ctx: Context, alpaca: Path, size: dict[str, int]) -> dict[str, dict[int, Any]]:
    """vLLM's and Orca (Oracle)'s sustainable Alpaca rate at each number of samples."""
    systems = {"vLLM": VLLM, "Orca (Oracle)": ORCA}
    pairs = [(system, n) for system in systems for n in SAMPLES]
    searches = [
        SearchJob(
            f"{system} n={n}",
            (*systems[system], f"workload.path={alpaca}", f"workload.n={n}"),
            (parse_condition(f"normalized_latency<={BOUND:g}"),),
            label=f"capacity {system} n={n}",
            low=1.0,
            high=MAX_RATE,
            max_probes=size["probes"],
            at=partial(probe_at, size["seconds"]),
        )
        for system, n in pairs
    ]  # fmt: skip
    out: dict[str, dict[int, Any]] = {system: {} for system in systems}
    for (system, n), found in zip(pairs, ctx.search(BASE, searches), strict=True):
        out[system][n] = {"rate": found.result.goodput, "status": found.result.status}
    return out


def cells_of(saving: dict[str, float]) -> list[Cell]:
    beams = "SmolLM2-135M's own beams on a CPU (the paper's: OPT-13B's)"
    cells = [
        Cell(f"Alpaca, parallel sampling, n={n}: memory saving", PARALLEL[n],
             saving[f"alpaca n={n}"], "%", source=FIG15)
        for n in SAMPLES
    ]  # fmt: skip
    cells += [
        Cell("ShareGPT, parallel sampling, n=2: memory saving", SHAREGPT_PARALLEL[0],
             saving["sharegpt n=2"], "%", source=TEXT + ", its low end"),
        Cell("ShareGPT, parallel sampling, n=6: memory saving", SHAREGPT_PARALLEL[1],
             saving["sharegpt n=6"], "%", source=TEXT + ", its high end"),
    ]  # fmt: skip
    cells += [
        Cell(f"Alpaca, beam search, width {n}: memory saving", BEAM[n],
             saving[f"alpaca beam width {n}"], "%", source=FIG15, note=beams)
        for n in SAMPLES
    ]  # fmt: skip
    cells += [
        Cell("ShareGPT, beam search, width 2: memory saving", SHAREGPT_BEAM[0],
             saving["sharegpt beam width 2"], "%", source=TEXT + ", its low end", note=beams),
        Cell("ShareGPT, beam search, width 6: memory saving", SHAREGPT_BEAM[1],
             saving["sharegpt beam width 6"], "%", source=TEXT + ", its high end", note=beams),
    ]  # fmt: skip
    return cells


def _saving_table(done: dict[str, JobOutcome]) -> str:
    rows = []
    for name, job in done.items():
        m = job.metrics
        rows.append({
            "run": name, "requests (samples)": m["requests"],
            "memory saving %": f"{100 * m['kv_sharing_saving']:.2f}",
            "forks": m["forks"], "blocks shared at forks": m["forked_blocks"],
            "blocks copied on write": m["cow_blocks"], "beam rounds": m["beam_rounds"],
            "preemptions": m["preemptions"],
            "normalized latency s/token": f"{m['normalized_latency_s']:.3f}",
        })  # fmt: skip
    return markdown_table(rows, list(rows[0]))


def _capacity_table(capacity: dict[str, dict[int, Any]]) -> str:
    rows = []
    for n in SAMPLES:
        vllm, orca = capacity["vLLM"][n]["rate"], capacity["Orca (Oracle)"][n]["rate"]
        rows.append({
            "samples": n, "vLLM req/s": f"{vllm:.2f}", "Orca (Oracle) req/s": f"{orca:.2f}",
            "vLLM / Orca (Oracle)": f"{vllm / orca:.2f}" if orca else "-",
        })  # fmt: skip
    return markdown_table(rows, list(rows[0]))


def draw(png: Path, saving: dict[str, float], capacity: dict[str, dict[int, Any]]) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = list(SAMPLES)
    a.bar([x - 0.3 for x in xs], [PARALLEL[n] for n in xs], width=0.3, label="paper, parallel")
    a.bar([x for x in xs], [saving[f"alpaca n={n}"] for n in xs], width=0.3,
          label="simulated, parallel")  # fmt: skip
    a.plot(xs, [BEAM[n] for n in xs], "k^--", label="paper, beam search")
    a.plot(xs, [saving[f"alpaca beam width {n}"] for n in xs], "rv-",
           label="SmolLM2 on a CPU, beam search")  # fmt: skip
    a.set(xlabel="samples (beam width) per request", ylabel="memory saving (%)", xticks=xs,
          title="Fig. 15: Alpaca")  # fmt: skip
    a.legend(fontsize=8)
    for system, by_n in capacity.items():
        b.plot(xs, [by_n[n]["rate"] for n in xs], marker="o", label=system)
    b.set(
        xlabel="samples per request",
        ylabel="sustainable rate (req/s)",
        xticks=xs,
        title=f"Fig. 14: Alpaca, <= {BOUND:g} s/token (simulated)",
    )
    b.legend(fontsize=8)
    save_figure(fig, png)


ASSUMPTIONS = [
    Assumption(
        "A fork shares the prompt's full blocks before its last token and copies the block "
        "holding the rest of it, then computes the last prompt token itself; vLLM shares the "
        "last block too until a sample writes into it, so where a prompt fills its last "
        "block exactly (1 prompt in 16) each sample holds one block more than under vLLM",
        "framework/core/sample_group.py",
    ),
    Assumption(
        "Beam search runs on SmolLM2-135M (fp32, this machine's CPU) over corpus prose at "
        "the traces' lengths, not on OPT-13B over Alpaca's and ShareGPT's own prompts: how "
        "long beams share a prefix is the model's; every request's beams run side by side "
        "and each runs to its trace's length (EOS ignored), as the benchmark's ignore_eos",
        "framework/engine/beams.py",
    ),
    Assumption(
        "The saving is time-weighted over the whole run (arrivals to the last finish); the "
        "artifact averages the ratio over its samples between 300 s and 900 s of a 900 s run",
        "sosp-ae-39/sosp-ae-astra, plot/plot_fig15.py",
    ),
    Assumption(
        "Every sample of a request has the request's output length (the trace's, EOS "
        "ignored), as vLLM's benchmark asks with ignore_eos",
        "framework/studies/reproductions/vllm_lengths.py",
    ),
    Assumption(
        "The rate of the ShareGPT runs (2 requests/s) is Fig. 13's; the paper does not state "
        "the rate behind its ShareGPT savings",
        "vLLM paper, section 6.3",
    ),
]
