"""The benchmark's rows: each system's tokens checked against the reference's, then its
times, one formula for every system, and the ratios to the peers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from experiments.bench.http_peers import HTTP_SYSTEMS, agreement
from experiments.bench.peers import Served
from experiments.bench.probe import decode_steps, host_share, linears_alone_s, mean
from experiments.bench.report import COLUMNS, fmt
from experiments.bench.systems import RATIO_PEERS, plan, serve
from experiments.toolkit.config import REFERENCE, Combo
from experiments.toolkit.engine import Context
from experiments.toolkit.report import percentile
from framework.core.request import RequestSpec
from framework.run.greedy_check import compare_greedy

TIMES = ("wall_s", "tokens_per_s", "requests_per_s", "ttft_p50", "ttft_p99", "tpot_p50")
TIMES += ("tpot_p99", "host_overhead_share", "host_overhead_share_b8", "linear_alone_s")


def check_outputs(
    ctx: Context, specs: list[RequestSpec], served: Served, ref: Served
) -> tuple[bool, int, str]:
    """(equal under the tie rule, ties accepted, the first difference)."""
    ties = 0
    for s in specs:
        ours = served.outputs.get(s.id)
        if ours is None:
            return False, ties, f"{s.id}: no output"
        got = compare_greedy(ctx.model, s.prompt_token_ids, s.id, ours, ref.outputs[s.id])
        if not got.equal:
            return False, ties, got.reason
        ties += got.divergence is not None
    return True, ties, ""


def measure(specs: list[RequestSpec], served: Served) -> dict[str, Any]:
    """The time columns of a row, one formula for every system."""
    tokens = sum(s.sampling.max_tokens for s in specs)
    ids = [s.id for s in specs]
    # The tokens a server says it generated, else those it sent, else (a server that streams
    # text sends no ids) the request's length.
    count = {
        s.id: served.counts.get(s.id) or len(served.outputs.get(s.id, ())) or s.sampling.max_tokens
        for s in specs
    }
    ttft = [served.first[i] - served.arrival[i] for i in ids if i in served.first]
    tpot = [
        (served.finish[i] - served.first[i]) / (count[i] - 1)
        for i in ids
        if i in served.first and i in served.finish and count[i] > 1
    ]
    wall = served.wall_s
    decode = decode_steps(served.steps)
    return {
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "requests_per_s": len(specs) / wall if wall > 0 else None,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
        "host_overhead_share": mean([host_share(st) for st in decode]),
        "host_overhead_share_b8": mean([host_share(st) for st in decode if st.rows == 8]),
    }


def make_row(
    system: str,
    combo: Combo | None,
    workload: str,
    specs: list[RequestSpec],
    checked: tuple[bool, int, str],
    served: Served | None,
    timed_anyway: bool = False,
) -> dict[str, Any]:
    """One system's row; its times only where its tokens equal the reference's, or, with
    `timed_anyway` (another engine's kernels, whose agreement the note reports), always."""
    equal, ties, why = checked
    row: dict[str, Any] = dict.fromkeys(COLUMNS, None)
    scheduler, allocator, output = combo or ("", "", "")
    row |= {"system": system, "scheduler": scheduler, "allocator": allocator, "output": output}
    row |= {"workload": workload, "requests": len(specs), "outputs_equal": equal, "ties": ties}
    row["output_tokens"] = sum(s.sampling.max_tokens for s in specs)
    if (equal or timed_anyway) and served is not None:
        row |= measure(specs, served)
    notes = [why, served.note if served else ""]
    if equal and served is not None and system != "nanoserve" and not served.first:
        notes.append("TTFT/TPOT not observable")
    row["note"] = "; ".join(n for n in notes if n)
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's tokens/s over each peer's, on the same workload in the same dtype."""
    for peer in RATIO_PEERS:
        base = {(r["workload"], r["dtype"]): r["tokens_per_s"] for r in rows if r["system"] == peer}
        for r in rows:
            b = base.get((r["workload"], r["dtype"]))
            if b and r["tokens_per_s"]:
                r[f"ratio_vs_{peer}"] = r["tokens_per_s"] / b


def decode(ctx: Context) -> Callable[[list[int]], str]:
    """Token ids to text as nanoserve's server streams it (special tokens skipped)."""
    return lambda ids: str(ctx.tok.decode(ids, skip_special_tokens=True))


def serve_workload(
    ctx: Context,
    args: argparse.Namespace,
    workload: str,
    specs: list[RequestSpec],
    tick: Callable[[str], None],
) -> list[dict[str, Any]]:
    """One row per system. The reference and the peers, whose ratios are the targets, run
    `args.rounds` rounds in turn (so that a slow spell of a shared machine falls on all of
    them) and report their median run; the other combinations run once."""
    systems = plan(args)
    runs: dict[int, list[Served]] = {i: [] for i in range(len(systems))}
    failed: dict[int, str] = {}
    for rnd in range(args.rounds):
        for i, (system, combo) in enumerate(systems):
            repeated = combo is None or combo == REFERENCE
            if i in failed or (rnd > 0 and not repeated):
                continue
            try:
                runs[i].append(serve(ctx, system, combo, specs))
            except Exception as exc:  # a peer that fails is a row that says so, not a crash
                if combo == REFERENCE:
                    raise
                failed[i] = f"failed: {type(exc).__name__}: {exc}"
    ref = runs[0][0]
    rows = []
    for i, (system, combo) in enumerate(systems):
        label = f"{system} {'/'.join(combo)}" if combo else system
        served, checked = None, (False, 0, failed.get(i, ""))
        if runs[i]:
            served = sorted(runs[i], key=lambda x: x.wall_s)[(len(runs[i]) - 1) // 2]
            if system in HTTP_SYSTEMS:  # another engine's kernels: agreement, not a veto
                agreed = (agreement(specs, x, ref, decode(ctx)) for x in runs[i])
                checks = [(equal, 0, note) for equal, note in agreed]
            else:
                checks = [check_outputs(ctx, specs, x, ref) for x in runs[i]]
            checked = next((c for c in checks if not c[0]), checks[0])
        timed = system in HTTP_SYSTEMS and served is not None
        r = make_row(system, combo, workload, specs, checked, served, timed_anyway=timed)
        if len(runs[i]) > 1 and (r["outputs_equal"] or timed):
            walls = sorted(x.wall_s for x in runs[i])
            spread = f"median of {len(walls)} runs (wall {walls[0]:.3g}-{walls[-1]:.3g} s)"
            r["note"] = "; ".join(n for n in (r["note"], spread) if n)
        if combo == REFERENCE:  # the kernels' share of its steps
            r["linear_alone_s"] = linears_alone_s(ctx.model, served.steps)
        if not r["outputs_equal"] and not timed:
            warn = f"WARNING {workload} {label}: outputs differ, no times: {r['note']}"
            print(warn, file=sys.stderr, flush=True)
        tick(f"{workload:13s} {label:45s} {fmt(r['tokens_per_s'])} tok/s")
        rows.append(r)
    return rows
