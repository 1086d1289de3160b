"""Window sweep: what deferring the readback k steps buys and costs, on one engine.

    python -m experiments.window_sweep                       # SmolLM2, chat prompts
    python -m experiments.window_sweep --windows 0 1 2 4 8 16 --max-tokens 16 64 model=tiny

One process, one loaded model: every window serves the same workload (the built-in chat
prompts, EOS honoured, at each generation length), and its outputs must equal window 0's
before any number is reported (a comparison refuses to compare different work). Writes
`window_sweep.csv`, `window_sweep.md` and `window_sweep.png` into `--out`.

Counts (transfers per step, overshoot, waste) hold on any machine; the seconds describe this
one. On a CPU the forward is synchronous and a readback costs microseconds, so deferral can
only add overshoot; the transfer it removes matters on an accelerator.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from omegaconf import OmegaConf

from experiments.toolkit import cli
from framework.core.step_stats import HOST_PHASES, PHASES
from framework.plugin_host.registry import registry
from framework.run.app import build_engine, load
from framework.run.compose import compose_cfg
from framework.run.paths import OUTPUTS
from framework.run.summary import summarize
from framework.tracking.tables import markdown_table, write_csv
from framework.workloads import build_workload


def sweep(
    overrides: list[str], windows: list[int], max_tokens: list[int], limit: int | None
) -> list[dict[str, Any]]:
    base = compose_cfg(overrides)
    model, tok, device, dtype = load(base)
    rows: list[dict[str, Any]] = []
    for n in max_tokens:
        wl = OmegaConf.to_container(base.workload, resolve=True)
        wl.update({"kind": "chat", "max_tokens": n, "limit": limit})
        specs = build_workload(wl, tok)
        reference: dict[str, list[int]] | None = None
        runs = [("deferred", k, ["output=deferred", f"window={k}"]) for k in windows]
        runs.append(("adaptive", -1, ["output=adaptive", f"output.max_window={max(windows)}"]))
        for policy, k, over in runs:
            cfg = compose_cfg([*overrides, *over])
            engine = build_engine(cfg, model, device, dtype, registry().pm.hook)
            result = engine.run(specs, tok.eos_token_id)
            outs = {s.id: s.output_token_ids for s in result.seqs}
            if reference is None:
                reference = outs
            if outs != reference:
                raise AssertionError(
                    f"{policy} window {k}, max_tokens {n}: outputs differ from window "
                    f"{windows[0]}; not comparing different work"
                )
            s = summarize(result)
            steps = max(s["steps"], 1)
            phase = {p: sum(st.phase_s.get(p, 0.0) for st in result.steps) / steps for p in PHASES}
            rows.append(
                {
                    "max_tokens": n,
                    "policy": policy,
                    "window": k if policy == "deferred" else round(s["window"], 3),
                    "requests": s["requests"],
                    "steps": s["steps"],
                    "transfers": s["transfers"],
                    "transfers_per_step": s["transfers_per_step"],
                    "deferred_tokens": s["deferred_tokens"],
                    "tokens_kept": s["tokens_kept"],
                    "overshoot_tokens": s["overshoot_tokens"],
                    "expected_overshoot": s["expected_overshoot"],
                    "token_slots": s["token_slots"],
                    "waste_fraction": s["waste_fraction"],
                    "stopped_requests": sum(1 for q in result.seqs if q.finish_reason == "stop"),
                    "forward_s_per_step": phase["forward"] + phase["sample"],
                    "host_s_per_step": sum(phase[p] for p in HOST_PHASES),
                    **{f"{p}_s_per_step": phase[p] for p in PHASES},
                    "step_s": s["step_mean_s"],
                    "makespan_s": s["makespan_s"],
                    "outputs_equal": True,
                }
            )
            print(
                f"max_tokens={n:4d} {policy} window={rows[-1]['window']} "
                f"transfers/step={s['transfers_per_step']:.3f} "
                f"overshoot={s['overshoot_tokens']} (expected {s['expected_overshoot']:.1f}) "
                f"waste={s['waste_fraction']:.3f} step={s['step_mean_s'] * 1e3:.1f} ms",
                flush=True,
            )
    return rows


def write(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, list(rows[0]), out / "window_sweep.csv")
    cols = [
        "max_tokens",
        "window",
        "transfers_per_step",
        "overshoot_tokens",
        "expected_overshoot",
        "waste_fraction",
        "host_s_per_step",
        "step_s",
    ]
    (out / "window_sweep.md").write_text(markdown_table(rows, cols) + "\n")

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for n in sorted({r["max_tokens"] for r in rows}):
        rs = [r for r in rows if r["max_tokens"] == n and r["policy"] == "deferred"]
        ad = next(r for r in rows if r["max_tokens"] == n and r["policy"] == "adaptive")
        axes[3].axhline(ad["step_s"] * 1e3, ls=":", lw=1, label=f"adaptive step, {n}")
        ks = [r["window"] for r in rs]
        axes[0].plot(ks, [r["transfers_per_step"] for r in rs], "o-", label=f"max_tokens={n}")
        axes[1].plot(ks, [r["overshoot_tokens"] for r in rs], "o-", label=f"measured, {n}")
        axes[1].plot(ks, [r["expected_overshoot"] for r in rs], "x--", label=f"(k+1)/2 model, {n}")
        axes[2].plot(ks, [r["waste_fraction"] for r in rs], "o-", label=f"max_tokens={n}")
        axes[3].plot(ks, [r["forward_s_per_step"] * 1e3 for r in rs], "o-", label=f"forward, {n}")
        axes[3].plot(ks, [r["host_s_per_step"] * 1e3 for r in rs], "x--", label=f"host, {n}")
    titles = ["transfers per step", "overshoot tokens", "waste fraction", "ms per step"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("window k")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "window_sweep.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    ap = cli.parser(__doc__)
    ap.add_argument("--windows", type=int, nargs="+", default=[0, 1, 2, 3, 4, 6, 8, 12, 16])
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--limit", type=int, default=None, help="first N chat prompts (default all)")
    cli.add_out(ap, None, "the folder (default outputs/window_sweep/DATE_TIME)")
    cli.add_overrides(ap, "Hydra overrides of the base run config")
    args = ap.parse_args(argv)
    out = args.out or OUTPUTS / "window_sweep" / time.strftime("%Y-%m-%d_%H-%M-%S")
    torch.manual_seed(0)
    rows = sweep(args.overrides, sorted(set(args.windows)), args.max_tokens, args.limit)
    write(rows, out)
    print(f"results in {out}")
    return out
