"""What a run's own observers cost it: the default observers against `observers=[console]`,
whole `python run.py` processes in alternating rounds, as ratios of makespan and TTFT p50.

    python -m experiments.ab --observers                       # SmolLM2, the store kept
    python -m experiments.ab --observers --fresh-store         # a new store every B run
    python -m experiments.ab --observers dtype=bfloat16 --rounds 7
    python -m experiments.ab --observers --quick               # tiny model, no untimed pair

A run's observers (the MLflow run, the plots, the progress bar) live in the run's own process
and may start helpers beside it, so only whole processes show what they cost: each run here
is one `python run.py`, as a user starts it. A serves with `observers=[console]`, B with the
config's default observers. Both serve the same queue: the shipped chat prompts through the
chat template, cycled to `--requests` (48), all queued at t=0, each generating exactly 48
tokens (EOS ignored). After one untimed run of each (the model's cache and the store made;
`--quick` skips them, and its first round's runs stand in for them), the rounds alternate
which goes first (A B, B A, ...). Each round gives B/A of the makespan
and of the TTFT p50, both taken from the run's own `metrics.json`; their medians and range are
the result, with each run's start-up (`startup_*_s`) and whole process wall time beside them.
Both settings' tokens must be identical before any time is reported.

The engine times its kernel choices when it starts (`engine.packed_linears=auto`, ...). Where
two kernels are close, the choice goes either way from one process to the next, and the run's
speed with it (on the Intel Xeon VM with AMX the Linear layers' choice flipped in a quarter of
the runs and moved TPOT by 17%): noise that is not the observers'. So every run after the
first is given the first run's choices (`--unpinned`: each run measures its own). A helper
that slowed the start-up would still show, in `startup_load_s`.

`--fresh-store` gives every B run a new SQLite store in a folder of its own (the first run in
a new directory: MLflow makes and migrates its tables); without it, B's runs share one store,
made by the untimed run. Writes `observers_ab.csv` (one row per run) and `observers_ab.md`;
logged to MLflow (`nanoserve.kind=observers_ab`) once every run is done.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from experiments.toolkit.report import num, write_rounded_csv
from framework.executors.linear_choice import small_pin
from framework.run.compose import compose_cfg
from framework.run.paths import ROOT
from framework.tracking.machine import cpu_model, isa_summary
from framework.tracking.tool_run import log_run

METRICS = ("makespan_s", "ttft_p50_s")  # the ratios the target is set on
# The engine's measured kernel choices: metrics.json's key, the setting, the word for "on".
CHOICES = (
    ("linears", "engine.packed_linears", "packed"),
    ("decode_attention", "engine.paged_kernel", "paged_kernel"),
    ("argmax", "engine.argmax_kernel", "kernel"),
    ("layer_glue", "engine.layer_glue", "fused"),
)
STARTUP = ("startup_load_s", "startup_observers_s")
COLUMNS = ("round", "setting", *METRICS, "tpot_p50_s", *STARTUP, "process_s", "kernels")
TIMES = COLUMNS[2:-1]
TARGET = 0.03  # B within 3% of A
A_OBSERVERS = "observers=[console]"


def chat_queue_file(path: Path, n: int, max_tokens: int) -> Path:
    """The shipped chat prompts cycled to `n` JSON Lines requests, each `max_tokens` long."""
    text = resources.files("framework.workloads").joinpath("data/chat_prompts.jsonl").read_text()
    prompts = [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    lines = [
        json.dumps({"prompt": prompts[i % len(prompts)], "max_tokens": max_tokens,
                    "ignore_eos": True})
        for i in range(n)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def serve_once(out: Path, tag: str, overrides: list[str]) -> dict[str, Any]:
    """One `python run.py` in `out`, its run folder `out/runs/<tag>`; what it measured."""
    folder = out / "runs" / tag
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *overrides, f"hydra.run.dir={folder}"],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    (out / "runs" / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"run {tag} failed (exit {proc.returncode}): {' '.join(tail)}")
    metrics = json.loads((folder / "metrics.json").read_text())
    outputs = [json.loads(line) for line in (folder / "outputs.jsonl").read_text().splitlines()]
    return {
        **{k: metrics.get(k) for k in (*METRICS, "tpot_p50_s", *STARTUP)},
        "process_s": wall,
        "tokens": {o["id"]: o["output_token_ids"] for o in outputs},
        "kernels": pinned_choices(metrics),
    }


def pinned_choices(metrics: dict[str, Any]) -> list[str]:
    """The kernels a run ran (`linears: packed (measured: ...)`, ...) as the settings that
    fix them, so that other runs need not measure them again."""
    pins = [
        f"{key}={str(metrics[field]).startswith(on + ' ')}".lower()
        for field, key, on in CHOICES
        if field in metrics
    ]
    if "small_linear" in metrics:  # a row count, not on / off
        pins.append(f"engine.small_linear={small_pin(str(metrics['small_linear']))}")
    return pins


def compare(
    out: Path, shared: list[str], rounds: int, fresh_store: bool, pin: bool, warm_up: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of the timed runs, after the untimed pair and the token check; and the kernel
    choices every run after the first was given (`pin`: the first run's, else none).
    Without `warm_up` (`--quick`) there is no untimed pair: the first round's runs are the
    ones the kernels are pinned from and the tokens are checked against."""
    kept_store = f"mlflow.tracking_uri=sqlite:///{out / 'store' / 'mlflow.db'}"

    def overrides(setting: str, tag: str) -> list[str]:
        if setting == "A":
            return [*shared, A_OBSERVERS]
        store = f"sqlite:///{out / 'stores' / tag / 'mlflow.db'}" if fresh_store else None
        return [*shared, f"mlflow.tracking_uri={store}" if store else kept_store]

    warm: dict[str, dict[str, Any]] = {}
    pinned: list[str] = []

    def first(k: str, got: dict[str, Any]) -> None:
        """A setting's first run: A's kernels are pinned for every later run, and the two
        settings' tokens must agree."""
        nonlocal shared, pinned
        warm[k] = got
        if k == "A" and pin:
            pinned = got["kernels"]
            shared = [*shared, *pinned]  # `overrides` reads `shared` when called
        if len(warm) == 2 and warm["A"]["tokens"] != warm["B"]["tokens"]:
            raise ValueError("A and B produced different tokens, so no time is compared")

    if warm_up:
        for k in ("A", "B"):
            first(k, serve_once(out, f"warm-{k}", overrides(k, f"warm-{k}")))
    rows = []
    for r in range(1, rounds + 1):
        for k in ("A", "B") if r % 2 else ("B", "A"):
            tag = f"r{r}-{k}"
            got = serve_once(out, tag, overrides(k, tag))
            if k not in warm:
                first(k, dict(got))
            if got.pop("tokens") != warm[k]["tokens"]:
                raise ValueError(f"round {r}: {k}'s tokens changed from its first run")
            got["kernels"] = " ".join(c.split("=", 1)[1] for c in got["kernels"])
            rows.append({"round": r, "setting": k, **got})
    return rows, pinned


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each setting's medians, and the medians and ranges of the rounds' ratios B/A."""
    out: dict[str, float] = {}
    by = {(r["round"], r["setting"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    for key in (*METRICS, "process_s"):
        ratios = [by[(n, "B")][key] / by[(n, "A")][key] for n in rounds]
        out[f"ratio_{key}"] = statistics.median(ratios)
        out[f"ratio_{key}_min"], out[f"ratio_{key}_max"] = min(ratios), max(ratios)
    for k in "AB":
        for key in TIMES:
            values = [r[key] for r in rows if r["setting"] == k and r[key] is not None]
            if values:
                out[f"{k.lower()}_{key}"] = statistics.median(values)
    return out


def write(
    out: Path, rows: list[dict[str, Any]], stats: dict[str, float], header: dict[str, str]
) -> Path:
    write_rounded_csv(out / "observers_ab.csv", COLUMNS, rows)
    lines = ["# nanoserve observers A/B", "", *[f"- {k}: {v}" for k, v in header.items()], ""]
    lines += ["| B/A | median | range | within 3% |", "|---|---|---|---|"]
    for key in (*METRICS, "process_s"):
        r, lo, hi = (stats[f"ratio_{key}{s}"] for s in ("", "_min", "_max"))
        met = "yes" if abs(r - 1) <= TARGET else "no"
        lines.append(f"| {key} | {r:.3f} | {lo:.3f}-{hi:.3f} | {met if key in METRICS else ''} |")
    lines += ["", "| setting | " + " | ".join(TIMES) + " |", "|---|" + "---|" * len(TIMES)]
    for k in "AB":
        cells = [num(stats.get(f"{k.lower()}_{c}")) for c in TIMES]
        lines.append(f"| {k} (median) | " + " | ".join(cells) + " |")
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for r in rows:
        cells = [str(r["round"]), r["setting"], *(num(r[c]) for c in TIMES), r["kernels"]]
        lines.append("| " + " | ".join(cells) + " |")
    md = out / "observers_ab.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--observers",
        action="store_true",
        help="the default observers against observers=[console], whole processes "
        "(experiments/bench/observers_ab.py)",
    )
    ap.add_argument(
        "--fresh-store", action="store_true", help="with --observers: a new store every B run"
    )
    ap.add_argument(
        "--requests", type=int, default=48, help="with --observers: chat requests queued (48)"
    )
    ap.add_argument(
        "--unpinned",
        action="store_true",
        help="with --observers: every run measures its own kernel choices (default: the "
        "first run's, for all)",
    )


def main(args: argparse.Namespace, shared: list[str], command: str) -> Path:
    """Run the preset into `args.out` and print its table; the file's path."""
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    queue = chat_queue_file(out / "chat_queue.jsonl", args.requests, 48)
    shared = [*shared, "workload=jsonl", f"workload.path={queue}", "workload.chat=true"]
    cfg = compose_cfg(shared)
    rows, pinned = compare(
        out, shared, args.rounds, args.fresh_store, not args.unpinned, warm_up=not args.quick
    )
    header = {
        "command": f"`{command}`",
        "CPU": f"{cpu_model()} ({os.cpu_count()} cores; {isa_summary()})",
        "A": A_OBSERVERS,
        "B": f"observers={list(cfg.observers)} (the default)"
        + (", a fresh store every run" if args.fresh_store else ", one store"),
        "shared": " ".join(shared),
        "kernels": " ".join(pinned) + " (the first run's choices, for every timed run)"
        if pinned
        else "each run's own measured choices (`--unpinned`)",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    stats = summary(rows)
    md = write(out, rows, stats, header)
    print(md.read_text())
    log_run(cfg, args, [md, out / "observers_ab.csv"], stats, tool="ab", kind="observers_ab")
    return md
