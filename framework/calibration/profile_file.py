"""What a profile file says besides its fit: where it was measured (model, dtype, CPU or GPU,
threads, kernels, commit, the grid), its default name, the raw steps beside it, and the
report printed when it is written."""

from __future__ import annotations

import csv
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from framework.calibration.grid import SAMPLED, Point
from framework.calibration.point_run import PointRun
from framework.core.step_stats import HOST_PHASES
from framework.executors.simulated.cost import model_id
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.profile import MeasuredProfile
from framework.run.paths import OUTPUTS
from framework.tracking.machine import cpu_info
from framework.tracking.tags import environment_tags


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def hardware_slug(device: torch.device, cpu: dict[str, Any]) -> str:
    """`amd-epyc-zen4`, `intel-xeon-platinum-8480-amx`, `nvidia-h200`: what a profile's file
    name says it was measured on."""
    if device.type == "cuda":
        return slug(torch.cuda.get_device_name(device))
    name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\d+-core processor", " ", cpu["cpu"], flags=re.I)
    parts = [slug(name)]
    isa = cpu["isa"]
    if cpu["microarchitecture"]:
        parts.append(cpu["microarchitecture"])
    elif isa.get("amx_bf16"):
        parts.append("amx")
    elif isa.get("avx512_bf16"):
        parts.append("avx512bf16")
    elif isa.get("avx512f"):
        parts.append("avx512")
    return "-".join(p for p in parts if p)


def model_name(cfg: DictConfig) -> str:
    if cfg.model.source == "hf":
        return slug(Path(cfg.model.path).name)
    return str(cfg.model.source)


def make_meta(
    cfg: DictConfig,
    model: Any,
    device: torch.device,
    grid: list[Point],
    command: str,
    paths: dict[str, str],
) -> dict[str, Any]:
    env = environment_tags()
    cpu = cpu_info()
    return {
        "model_id": model_id(model.config),
        "model": model_name(cfg),
        "model_source": str(cfg.model.source),
        "dtype": str(cfg.dtype),
        "device": str(device),
        "device_type": device.type,
        # `machine.cpu` as `environment_tags` names it: how a run finds the profile measured
        # on its own CPU among several shipped for one model x dtype.
        "machine": {
            **cpu,
            "gpu": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else environment_tags()["machine.gpu"],
            "threads": torch.get_num_threads(),
        },
        "kernels": paths,
        "engine": {
            "block_size": int(cfg.engine.block_size),
            # as set (auto: measured at start-up; `kernels` says what ran)
            "packed_linears": str(cfg.engine.packed_linears),
            "small_linear": str(cfg.engine.small_linear),
            "paged_kernel": str(cfg.engine.paged_kernel),
            "argmax_kernel": str(cfg.engine.argmax_kernel),
            "check_invariants": bool(cfg.engine.check_invariants),
        },
        "torch": str(torch.__version__),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": env.get("git.commit", "unknown"),
        "dirty": env.get("git.dirty", "unknown"),
        "command": command,
        "sampled_requests": dict(SAMPLED),
        "grid": [
            {
                "name": p.name,
                "requests": len(p.prompt_lens),
                "max_num_seqs": p.max_num_seqs,
                "prompt_lens": sorted(set(p.prompt_lens)),
                "max_output": max(p.output_lens),
                "holdout": p.holdout,
            }
            for p in grid
        ],
    }


def default_out(cfg: DictConfig, device: torch.device) -> Path:
    name = f"{model_name(cfg)}-{cfg.dtype}-{hardware_slug(device, cpu_info())}.yaml"
    return OUTPUTS / "calibrate" / name


def write_raw(path: Path, runs: Iterable[PointRun]) -> None:
    """Every timed step, for refitting by hand: the point, its features and seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        names = list(StepFeatures.__dataclass_fields__)
        head = [
            "point",
            "holdout",
            "run",
            "others_cpu",
            "probe_decode_s",
            "probe_prefill_s",
            *names,
        ]
        w.writerow([*head, "forward_s", "sample_s", "prepare_s", "host_s", "transfers"])
        for i, m in enumerate(runs):
            for (feat, fw, sm, prep), st in zip(m.steps, m.stats, strict=True):
                host = sum(st.phase_s.get(p, 0.0) for p in HOST_PHASES)
                w.writerow(
                    [
                        m.point.name,
                        m.point.holdout,
                        i,
                        round(m.foreign, 4),
                        *(m.probes or ("", "")),
                        *feat.as_dict().values(),
                        fw,
                        sm,
                        prep,
                        host,
                        st.transfers,
                    ]
                )


def report(profile: MeasuredProfile) -> str:
    r = profile.fit_report
    m = profile.meta
    lines = [
        f"profile for {m['model']} ({m['model_id']}), {m['dtype']} on {m['device']} "
        f"({m['machine']['cpu']}, {m['machine']['threads']} threads)",
        f"fitted on {r['points']} steps of {r['groups']} grid points; held out "
        f"{r['holdout_points']} steps of {r['holdout_groups']}",
    ]
    for name in ("forward", "sample"):
        for split in ("train", "holdout"):
            k = f"{name}_{split}_"
            if f"{k}mape" in r:
                lines.append(
                    f"  {name:7s} {split:7s}: per step MAPE {r[k + 'mape']:.1%} "
                    f"(p90 {r[k + 'p90']:.1%}, max {r[k + 'max']:.1%}); per run "
                    f"{r[k + 'run_mape']:.1%} (max {r[k + 'run_max']:.1%}, median "
                    f"{r[k + 'run_bias']:+.1%})"
                )
    if "measured_forward_holdout_mape" in r:
        lines.append(
            f"  forward holdout, fitted as measured (--drift none): per step MAPE "
            f"{r['measured_forward_holdout_mape']:.1%}; "
            f"per run {r['measured_forward_holdout_run_mape']:.1%}"
        )
    if "pass_spread_measured" in r:
        lines.append(
            f"  a point's passes apart (median): {r['pass_spread_measured']:.1%} as measured"
            + (
                f", {r['pass_spread_steadied']:.1%} at the grid's median state (--drift probes)"
                if "pass_spread_steadied" in r
                else ""
            )
        )
    for name in ("host", "prepare"):
        if f"{name}_holdout_total_error" in r:
            lines.append(
                f"  {name:7s} holdout: total error {r[f'{name}_holdout_total_error']:+.1%}"
            )
    f = profile.forward
    terms = ", ".join(f"{t} {c:.3g}" for t, c in f.per.items())
    lines.append(
        f"forward: {f.intercept_s * 1e3:.2f} ms + {terms} (s per unit); the relative fit "
        f"scaled by {r['forward_scale']:.3f} (sample {r['sample_scale']:.3f}) to the runs' sums"
    )
    s = profile.sample
    lines.append(
        f"sample: {s.intercept_s * 1e6:.1f} us + "
        + ", ".join(f"{t} {c * 1e6:.2f} us" for t, c in s.per.items())
    )
    lines.append(
        f"host: {profile.host.per_step_s * 1e6:.0f} us/step + {profile.host.per_row_s * 1e6:.1f} "
        f"us/row; readback {profile.readback_s * 1e6:.1f} us"
    )
    p = profile.prepare
    lines.append(
        f"prepare: {p.intercept_s * 1e6:.1f} us + "
        + ", ".join(f"{t} {c * 1e6:.3f} us" for t, c in p.per.items())
    )
    lines.append(
        f"calibration: {r.get('calibration_s')} s, {r.get('passes')} passes; others' CPU "
        f"{r.get('others_cpu_share_mean', 0):.1%}, {r.get('remeasured_points')} points measured "
        f"again, {r.get('waited_s')} s waited; canary {r.get('canary_start_s', 0) * 1e3:.1f} -> "
        f"{r.get('canary_end_s', 0) * 1e3:.1f} ms"
    )
    return "\n".join(lines)
