"""Write an analytic (per-operator) profile: a hardware spec and a model's config in, a
`kind: analytic` profile file out, which `executor.profile=PATH` (load_cost_model) reads.

    python -m experiments.analytic_profile --hardware h100-sxm \\
        --model framework/executors/simulated/models/llama-8b --dtype bfloat16 [--out PATH]

`--hardware` is a shipped spec's name (framework/executors/simulated/hardware/NAME.yaml) or a
spec file's path; `--model` is anything `AutoConfig.from_pretrained` reads (a folder with a
config.json: no weights needed). Without `--out` the profile goes to
framework/executors/simulated/profiles/MODEL-DTYPE-HARDWARE.analytic.yaml. It prints what the
profile predicts for a few steps (decode at batch 1 and 64, a 2k prefill), labelled
analytic: nothing here is measured. See docs/simulator-analytic.md.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from pathlib import Path
from typing import Any

from framework.executors.simulated.analytic import PROFILES_DIR, AnalyticProfile
from framework.executors.simulated.cost import ProfileError, model_id
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.gpu.hardware import load_hardware_spec
from framework.run.paths import ROOT

DECODE_CTX = 1024  # each decode row's context in the summary's decode steps
PREFILL_TOKENS = 2048


def decode_step(batch: int, ctx: int = DECODE_CTX) -> StepFeatures:
    """`batch` greedy rows decoding one token each over `ctx` tokens of context."""
    return StepFeatures(
        rows=batch,
        num_tokens=batch,
        linear_tokens=batch,
        prefill_rows=0,
        prefill_tokens=0,
        prefill_attn=0,
        decode_rows=batch,
        decode_ctx=batch * ctx,
        random_rows=0,
    )


def prefill_step(tokens: int = PREFILL_TOKENS) -> StepFeatures:
    """One fresh prompt of `tokens` tokens, prefilled whole (it samples its first token)."""
    return StepFeatures.prompt(tokens, linear_tokens=tokens)


def summary(profile: AnalyticProfile) -> list[dict[str, Any]]:
    """What the profile predicts for the steps the docs quote."""
    steps = [
        ("decode b=1", decode_step(1), 1),
        ("decode b=64", decode_step(64), 64),
        (f"prefill {PREFILL_TOKENS}", prefill_step(), PREFILL_TOKENS),
    ]
    out = []
    for label, features, tokens in steps:
        e = profile.estimate(features)
        total = e.forward_s + e.sample_s
        out.append(
            {
                "step": label,
                "forward_ms": e.forward_s * 1e3,
                "sample_ms": e.sample_s * 1e3,
                "bound": e.bound,
                "tokens_per_s": tokens / total,
            }
        )
    return out


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def make_profile(
    hardware: str,
    model: str,
    dtype: str,
    tensor_parallel: int = 1,
    interconnect: str | None = None,
) -> AnalyticProfile:
    """The profile, its meta filled in from the loaded config and this checkout."""
    from transformers import AutoConfig

    spec = load_hardware_spec(hardware)
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise ProfileError(f"--model {model}: no readable config ({exc})") from exc
    name = Path(model).name if Path(model).exists() else model
    meta = {
        "model_id": model_id(config),
        "model": name,
        "dtype": dtype,
        "device": spec["name"],
        "hardware": spec["id"],
        "analytic": True,
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "made_by": f"python -m experiments.analytic_profile --hardware {hardware} "
        f"--model {model} --dtype {dtype}"
        + (
            f" --tensor-parallel {tensor_parallel}"
            + (f" --interconnect {interconnect}" if interconnect else "")
            if tensor_parallel > 1
            else ""
        ),
    }
    return AnalyticProfile.build(
        spec,
        config.to_dict(),
        dtype,
        meta=meta,
        tensor_parallel=tensor_parallel,
        interconnect=interconnect,
    )


def write(profile: AnalyticProfile, out: Path) -> Path:
    import yaml

    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# An ANALYTIC profile: a per-operator estimate from a hardware spec and a model config,\n"
        "# not a measurement (docs/simulator-analytic.md). Remade by meta.made_by.\n"
    )
    body = yaml.safe_dump(profile.to_dict(), sort_keys=False, width=100, allow_unicode=True)
    out.write_text(header + body, encoding="utf-8")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", required=True, help="a shipped spec's name or a spec file")
    ap.add_argument("--model", required=True, help="a folder with a config.json (or a hub id)")
    ap.add_argument("--dtype", default="bfloat16", help="float32, tfloat32, bfloat16, float16")
    ap.add_argument("--tensor-parallel", type=int, default=1, help="GPUs a replica spans")
    ap.add_argument(
        "--interconnect", default=None, help="dgx or nvlink_pair (TP > 1; unset: the spec's own)"
    )
    ap.add_argument("--out", type=Path, default=None, help="the profile file to write")
    ap.add_argument(
        "--against",
        default=None,
        help="a measured profile of the same model and dtype (experiments.calibrate on that "
        "device): both predictions of the same steps, side by side",
    )
    return ap.parse_args(argv)


def against(profile: AnalyticProfile, path: str) -> tuple[list[dict[str, Any]], str]:
    """The quoted steps as `profile` and a measured profile at `path` predict them: how far
    the spec's fits and assumptions land from that device's own seconds.
    The measured profile must describe the same model and dtype. Returns the rows and the
    measured profile's device."""
    from framework.executors.simulated.load import load_cost_model

    measured = load_cost_model(path)
    theirs = (measured.meta.get("model_id"), measured.meta.get("dtype"))
    ours = (profile.meta["model_id"], profile.dtype)
    if theirs != ours:
        raise ProfileError(
            f"--against {path} is for {theirs[0]} in {theirs[1]}, not {ours[0]} in {ours[1]}"
        )
    steps = [
        ("decode b=1", decode_step(1)),
        ("decode b=64", decode_step(64)),
        (f"prefill {PREFILL_TOKENS}", prefill_step()),
    ]
    rows = []
    for label, features in steps:
        a, m = profile.predict(features), measured.predict(features)
        rows.append(
            {
                "step": label,
                "analytic_ms": 1e3 * (a.forward_s + a.sample_s),
                "measured_ms": 1e3 * (m.forward_s + m.sample_s),
            }
        )
    # The engine's host work per step, which decides what deferred output can hide behind
    # a GPU's forward (executor.overlap): the spec's guess against the measured fit.
    for label, host in (("host (analytic)", profile.host), ("host (measured)", measured.host)):
        rows.append(
            {
                "step": label,
                "per_step_us": 1e6 * host.per_step_s,
                "per_row_us": 1e6 * host.per_row_s,
            }
        )
    return rows, str(measured.meta.get("device", "?"))


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    try:
        profile = make_profile(
            args.hardware, args.model, args.dtype, args.tensor_parallel, args.interconnect
        )
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tp = f"-tp{args.tensor_parallel}" if args.tensor_parallel > 1 else ""
    out = args.out or (
        PROFILES_DIR
        / f"{profile.meta['model']}-{args.dtype}-{profile.hardware.id}{tp}.analytic.yaml"
    )
    write(profile, out)
    print(f"wrote {out} (kind: analytic, {profile.meta['model_id']}, {profile.hardware.name})")
    print(f"analytic predictions (decode rows at {DECODE_CTX} tokens of context, greedy):")
    for row in summary(profile):
        print(
            f"  {row['step']:<13} forward {row['forward_ms']:8.3f} ms  sample "
            f"{row['sample_ms']:6.3f} ms  {row['bound']:<7} bound  "
            f"{row['tokens_per_s']:10.0f} tok/s"
        )
    if args.against:
        try:
            rows, device = against(profile, args.against)
        except ValueError as exc:  # a ProfileError too: missing, malformed, another model
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        print(f"against the profile measured in {args.against} ({device}), forward + sampling:")
        for row in rows:
            if "per_step_us" in row:
                print(
                    f"  {row['step']:<16} {row['per_step_us']:8.1f} us a step + "
                    f"{row['per_row_us']:6.2f} us a row"
                )
                continue
            print(
                f"  {row['step']:<13} analytic {row['analytic_ms']:8.3f} ms  measured "
                f"{row['measured_ms']:8.3f} ms  analytic/measured "
                f"{row['analytic_ms'] / row['measured_ms']:.2f}"
            )
    return out
