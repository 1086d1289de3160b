"""One prepared script for a GPU machine: the CUDA path end to end, in a few minutes.

    python -m experiments.cuda_check [model=smollm2] [--out DIR]

Checks, on `device=cuda`:
1. greedy output on the chat prompts equals CPU immediate output (ties aside), for
   output=immediate and deferred windows 1, 4, 16 (all must also equal each other);
2. the readback runs on a second stream into pinned memory (`Readback.overlap`), and the
   time a drain waits is reported per window, next to the forward time: with window 1 the
   wait should be a small fraction of a step (the copy overlapped the next forward);
3. the books balance (deferred = kept + overshoot) and no block leaks (the
   engine's own end-of-run checks).
Writes `cuda_check.json` and prints a table; exits non-zero on any mismatch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from experiments.toolkit import cli
from framework.plugin_host.registry import registry
from framework.run.app import build_engine, load
from framework.run.compose import compose_cfg
from framework.run.summary import summarize
from framework.workloads import build_workload


def run_once(overrides: list[str], loaded: tuple[Any, ...], specs: list[Any]) -> dict[str, Any]:
    model, tok, device, dtype = loaded
    cfg = compose_cfg(overrides)
    engine = build_engine(cfg, model, device, dtype, registry().pm.hook)
    t = time.perf_counter()
    res = engine.run(specs, tok.eos_token_id)
    wall = time.perf_counter() - t
    steps = max(len(res.steps), 1)
    return {
        "outputs": {s.id: s.output_token_ids for s in res.seqs},
        "overlap": engine.readback.overlap,
        "wall_s": wall,
        "forward_ms_per_step": 1e3 * sum(st.phase_s.get("forward", 0) for st in res.steps) / steps,
        "output_ms_per_step": 1e3 * sum(st.phase_s.get("output", 0) for st in res.steps) / steps,
        **{
            k: summarize(res)[k]
            for k in (
                "steps",
                "transfers_per_step",
                "overshoot_tokens",
                "deferred_tokens",
                "tokens_kept",
            )
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    cli.add_out(ap, Path("outputs/cuda_check"))
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per chat prompt (48)")
    cli.add_overrides(ap)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to check")
        return 2
    base = [*args.overrides]
    cpu = load(compose_cfg([*base, "device=cpu"]))
    gpu = load(compose_cfg([*base, "device=cuda"]))
    wl = OmegaConf.to_container(compose_cfg(base).workload, resolve=True)
    wl.update({"kind": "chat", "max_tokens": args.max_tokens})
    specs = build_workload(wl, cpu[1])
    reference = run_once([*base, "device=cpu"], cpu, specs)["outputs"]
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "runs": {}}
    ok = True
    immediate: dict[str, list[int]] | None = None
    for label, over in [("immediate", ["output=immediate"])] + [
        (f"window={k}", ["output=deferred", f"window={k}"]) for k in (1, 4, 16)
    ]:
        r = run_once([*base, "device=cuda", *over], gpu, specs)
        outputs = r.pop("outputs")
        immediate = immediate or outputs
        same = sum(outputs[i] == reference[i] for i in reference)
        r["same_as_cpu"] = f"{same}/{len(reference)}"
        r["outputs_equal_immediate"] = outputs == immediate
        ok &= r["outputs_equal_immediate"] and r["overlap"]
        ok &= r["deferred_tokens"] == r["tokens_kept"] + r["overshoot_tokens"]
        report["runs"][label] = r
        print(label, json.dumps(r))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_check.json").write_text(json.dumps(report, indent=2))
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
