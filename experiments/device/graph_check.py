"""One prepared script for a GPU: the engine's decode step as a serving engine's, in about
eight minutes on an H200.

    python -m experiments.graph_check [--model-path DIR] [--hardware NAME] [--out DIR]
    python -m experiments.graph_check --dry-run      (here, on a CPU: the same code, tiny sizes)

In order, each part's results written as it ends (`graph_check.json`, `graph_check.md`):
1. **probe**: torch, CUDA, the GPU, Triton, the kernels the executor chose;
2. **tokens**: the engine eager (`engine.cuda_graphs=false`) and through the decode graphs,
   greedy, under output immediate and deferred window 4, compared under the bf16 tie rule
   (`framework/run/greedy_check.py`);
3. **no wait**: `torch.cuda.set_sync_debug_mode("error")` around every step that replays a
   graph (on a CPU, `SyncWatch` in its place): a step that would wait raises, and is counted;
4. **decode step**: a step of decode rows at batch 1, 8, 32 and 64 over 1,024 positions each,
   back to back as the engine runs them (host and device overlapping), timed with CUDA
   events, eager and graphed, beside the analytic profile of this GPU for the same shape
   (target: graphed within 1.3x of the analytic at every batch);
5. **windows**: one workload served under output immediate and deferred windows 1, 4 and 8,
   with the readback stream and without it; the deferred gain at window 4 over immediate,
   measured, beside the simulator's prediction for the same run (the analytic profile);
6. **sim_check**: `experiments.sim_check`'s GPU mode, one round (SmolLM2's shape): TTFT,
   TPOT and makespan real against the simulator with this GPU's analytic profile and with a
   profile measured here (its own `sim_check/` tables).

Model: the 8B shape (`--model-path`, default the device kit's `llama-8b`, random weights in
bf16: the tokens are noise, the timings are the shape's). A dry run takes the tiny random
Llama in fp32 on the CPU, batches 1, 2 and 4 over 48 positions; its timings mean nothing,
it only shows the script runs through.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from experiments.toolkit import cli
from framework.core.request import RequestSpec, SamplingParams
from framework.engine.batch import Row, StepBatch
from framework.executors.simulated.analytic import AnalyticProfile
from framework.executors.simulated.features import StepFeatures
from framework.executors.sync_watch import SyncWatch
from framework.plugin_host.registry import registry
from framework.run.app import build_engine, load
from framework.run.compose import compose_cfg
from framework.run.greedy_check import compare_greedy
from framework.run.paths import ROOT
from framework.run.summary import summarize
from framework.tracking.tables import markdown_table

KIT_MODEL = ROOT / ".device_kit" / "llama-8b"
GPUS = {"H200": "h200", "H100": "h100-sxm", "A100": "a100-80gb"}  # device name -> spec
TARGET = 1.3  # graphed decode step / analytic, at most


def sizes(dry: bool) -> dict[str, Any]:
    """What each part runs at: the issue's sizes on a GPU, toy ones in a dry run."""
    if dry:
        return {"batches": (1, 2, 4), "ctx": 48, "repeat": 3, "requests": 6, "prompt": 24,
                "out": 8, "windows": (1, 4), "block": 4}  # fmt: skip
    return {"batches": (1, 8, 32, 64), "ctx": 1024, "repeat": 20, "requests": 64,
            "prompt": 512, "out": 128, "windows": (1, 4, 8), "block": 16}  # fmt: skip


def overrides(args: Any, dry: bool, size: dict[str, Any]) -> list[str]:
    blocks = max(size["batches"]) * (-(-(size["ctx"] + 8) // size["block"])) + 64
    common = [
        f"engine.block_size={size['block']}",
        f"engine.num_blocks={blocks}",
        f"engine.max_num_seqs={max(size['batches'])}",
        "engine.max_num_batched_tokens=8192",
        "scheduler=continuous",
        "allocator=incremental",
        "observers=[]",
    ]
    if dry:
        return ["model=tiny", "device=cpu", "dtype=float32", "model.max_model_len=256",
                "engine.packed_linears=false", "engine.layer_glue=false", *common]  # fmt: skip
    path = args.model_path or KIT_MODEL
    return [
        "model=hf", f"model.path={path}", "model.random_weights=true", "model.max_model_len=4096",
        "device=cuda", "dtype=bfloat16", *common,
    ]  # fmt: skip


def probe(dry: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available() and not dry:
        from torch.utils._triton import has_triton

        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                 "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                 "triton": has_triton()}  # fmt: skip
    else:
        info |= {"gpu": None, "cpu": platform.processor() or platform.machine()}
    return info


def hardware(name: str | None, gpu: str | None) -> str:
    if name:
        return name
    for key, spec in GPUS.items():
        if gpu and key in gpu:
            return spec
    return "h200"


def analytic(model: Any, hw: str, dtype: str) -> AnalyticProfile:
    """This GPU's analytic profile for the run's own model shape."""
    from framework.calibration.analytic_profile import load_hardware_spec

    return AnalyticProfile.build(load_hardware_spec(hw), model.config.to_dict(), dtype)


def decode_batch(rows: int, ctx: int, block: int, vocab: int) -> StepBatch:
    """`rows` decode rows, each over `ctx` positions in blocks of its own."""
    nb = -(-(ctx + 1) // block)
    greedy = SamplingParams()
    out = []
    for i in range(rows):
        table = list(range(i * nb, (i + 1) * nb))
        slot = table[ctx // block] * block + ctx % block
        out.append(Row(f"r{i}", [(7 * i + 3) % vocab], ctx, [slot], table, ctx + 1, greedy, 1))
    return StepBatch(out)


def watch_steps(engine: Any, dry: bool, found: list[str]) -> None:
    """Every step through a graph under the sync debug mode (CUDA) or `SyncWatch` (CPU):
    what would make the host wait is recorded in `found`."""
    inner = engine.executor.execute
    graphs = engine.executor.graphs

    def execute(batch: StepBatch) -> Any:
        if graphs is None or not graphs.fits(batch):
            return inner(batch)
        if dry:
            with SyncWatch() as watch:
                result = inner(batch)
            found.extend(watch.calls)
            return result
        torch.cuda.set_sync_debug_mode("error")
        try:
            return inner(batch)
        except RuntimeError as exc:
            found.append(str(exc).splitlines()[0])
            torch.cuda.set_sync_debug_mode(0)
            return inner(batch)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    engine.executor.execute = execute


def workload(size: dict[str, Any], vocab: int) -> list[RequestSpec]:
    greedy = SamplingParams(max_tokens=size["out"], ignore_eos=True)

    def prompt(i: int) -> list[int]:
        return [(11 * i + 5 * j) % (vocab - 3) + 3 for j in range(size["prompt"])]

    return [RequestSpec(f"r{i}", prompt(i), greedy) for i in range(size["requests"])]


def part_tokens(base: list[str], loaded: tuple, specs: list, dry: bool) -> dict[str, Any]:
    model, tok, device, dtype = loaded
    out: dict[str, Any] = {}
    found: list[str] = []
    for label, over in (("immediate", ["output=immediate"]),
                        ("window=4", ["output=deferred", "window=4"])):  # fmt: skip
        runs = {}
        for graphs in ("false", "true"):
            cfg = compose_cfg([*base, *over, f"engine.cuda_graphs={graphs}"])
            engine = build_engine(cfg, model, device, dtype, registry().pm.hook)
            if graphs == "true":
                watch_steps(engine, dry, found)
            res = engine.run(specs, tok.eos_token_id)
            runs[graphs] = {s.id: list(s.output_token_ids) for s in res.seqs}
            if graphs == "true":
                out.setdefault("graph_steps", {})[label] = engine.executor.graph_steps
        prompts = {s.id: s.prompt_token_ids for s in specs}
        verdicts = [compare_greedy(model, prompts[r], r, runs["true"][r], runs["false"][r])
                    for r in runs["false"]]  # fmt: skip
        out[label] = {
            "identical": sum(runs["true"][r] == runs["false"][r] for r in runs["false"]),
            "ties": sum(v.equal and v.divergence is not None for v in verdicts),
            "mismatches": [v.reason for v in verdicts if not v.equal],
            "requests": len(verdicts),
        }
    out["waits"] = found
    return out


def time_steps(executor: Any, batch: StepBatch, repeat: int, cuda: bool) -> float:
    """Milliseconds a step, `repeat` steps back to back after three untimed."""
    for _ in range(3):
        executor.execute(batch)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeat):
            executor.execute(batch)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeat
    t = time.perf_counter()
    for _ in range(repeat):
        executor.execute(batch)
    return 1e3 * (time.perf_counter() - t) / repeat


def part_decode(base: list[str], loaded: tuple, size: dict, prof: AnalyticProfile) -> list:
    model, _, device, dtype = loaded
    cuda = device.type == "cuda"
    hooks = registry().pm.hook

    def engine(graphs: str) -> Any:
        cfg = compose_cfg([*base, f"engine.cuda_graphs={graphs}"])
        return build_engine(cfg, model, device, dtype, hooks)

    engines = {g: engine(g) for g in ("false", "true")}
    rows = []
    for b in size["batches"]:
        batch = decode_batch(b, size["ctx"], size["block"], model.config.vocab_size)
        cost = prof.predict(StepFeatures.of(batch))
        ms = {g: time_steps(e.executor, batch, size["repeat"], cuda) for g, e in engines.items()}
        predicted = 1e3 * (cost.forward_s + cost.sample_s)
        rows.append({"batch": b, "ctx": size["ctx"], "eager_ms": ms["false"],
                     "graphs_ms": ms["true"], "analytic_ms": predicted,
                     "graphs_over_analytic": ms["true"] / predicted,
                     "eager_over_graphs": ms["false"] / ms["true"]})  # fmt: skip
    return rows


def part_windows(
    base: list[str], loaded: tuple, specs: list, prof_path: Path, windows: tuple[int, ...]
) -> list:
    """Each window served real (with the readback stream and without) and simulated."""
    model, tok, device, dtype = loaded
    rows = []
    outputs = [("immediate", ["output=immediate"])] + [
        (f"window={k}", ["output=deferred", f"window={k}"]) for k in windows
    ]
    for label, over in outputs:
        row: dict[str, Any] = {"output": label}
        for stream in (True, False):
            engine = build_engine(compose_cfg([*base, *over]), model, device, dtype,
                                  registry().pm.hook)  # fmt: skip
            if not stream:  # one stream: each drain's copy queues behind the forward
                engine.readback.overlap, engine.readback.stream = False, None
            t = time.perf_counter()
            s = summarize(engine.run(specs, tok.eos_token_id))
            key = "stream" if stream else "no_stream"
            row[f"{key}_tokens_per_s"] = s["output_tokens_per_s"]
            row[f"{key}_wall_s"] = time.perf_counter() - t
        sim = compose_cfg([*base, *over, "executor=simulated", f"executor.profile={prof_path}",
                           "executor.any_profile=true"])  # fmt: skip
        shape, _, host, _ = load(sim)  # the model's shape: the simulator reads no weights
        engine = build_engine(sim, shape, host, dtype, registry().pm.hook, say=False)
        row["simulated_tokens_per_s"] = summarize(engine.run(specs, tok.eos_token_id))[
            "output_tokens_per_s"
        ]
        rows.append(row)
    first = rows[0]
    for row in rows:
        for key in ("stream_tokens_per_s", "simulated_tokens_per_s"):
            row[key.replace("tokens_per_s", "gain")] = row[key] / first[key]
    return rows


def part_sim_check(args: Any, dry: bool) -> Path:
    """`experiments.sim_check`'s GPU mode, short (one round): SmolLM2's shape (the device
    kit's, random weights, bf16) real on this GPU against the simulator with this GPU's
    analytic profile and with a profile measured here just before; its own tables."""
    from experiments.sim import sim_check

    out = ["--rounds", "1", "--out", str(args.out / "sim_check")]
    if dry:
        return sim_check.main(["--dry-run", *out])
    smol = (args.model_path or KIT_MODEL).parent / "smollm2"
    return sim_check.main([*out, "model=hf", f"model.path={smol}", "model.random_weights=true",
                           "device=cuda", "dtype=bfloat16"])  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    lines = ["# graph_check", "", f"probe: `{json.dumps(report['probe'])}`", ""]
    tok = report.get("tokens", {})
    for label in ("immediate", "window=4"):
        if label in tok:
            t = tok[label]
            lines.append(f"- tokens, {label}: {t['identical']}/{t['requests']} identical, "
                         f"{t['ties']} ties, {len(t['mismatches'])} mismatches")  # fmt: skip
    if "waits" in tok:
        lines.append(f"- steps that would wait, graphed: {len(tok['waits'])}")
    if report.get("decode"):  # milliseconds a step
        cols = ("batch", "ctx", "eager_ms", "graphs_ms", "analytic_ms", "graphs_over_analytic")
        lines += ["", markdown_table(report["decode"], cols)]
    if report.get("windows"):  # simulated: the analytic profile of this GPU, same run
        cols = ("output", "stream_tokens_per_s", "no_stream_tokens_per_s", "stream_gain",
                "simulated_tokens_per_s", "simulated_gain")  # fmt: skip
        lines += ["", markdown_table(report["windows"], cols), "",
                  "simulated_*: SIMULATED, the same run on the simulator with this GPU's analytic "
                  "profile (a prediction); gains are against output=immediate"]  # fmt: skip
    lines += ["", f"verdict: {json.dumps(report.get('verdict', {}))}", ""]
    return "\n".join(lines)


def write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph_check.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "graph_check.md").write_text(markdown(report))


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    cli.add_out(ap, Path("outputs/graph_check"))
    ap.add_argument("--model-path", type=Path, default=None, help="a model folder (the 8B kit)")
    ap.add_argument("--hardware", default=None, help="analytic spec (default: from the GPU)")
    ap.add_argument("--dry-run", action="store_true", help="on this CPU, tiny sizes")
    parts = "tokens,decode,windows,sim_check"
    ap.add_argument("--skip", default="", help=f"parts to leave out, of {parts}")
    args = ap.parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device here: run with --dry-run")
        return 2
    size = sizes(dry)
    base = overrides(args, dry, size)
    report: dict[str, Any] = {"probe": probe(dry), "sizes": size, "overrides": base}
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.perf_counter()
    loaded = load(compose_cfg(base))
    model = loaded[0]
    hw = hardware(args.hardware, report["probe"].get("gpu"))
    prof = analytic(model, hw, "bfloat16" if not dry else "float32")
    from framework.calibration.analytic_profile import write as write_profile

    prof_path = write_profile(prof, args.out / f"analytic-{hw}.yaml")
    report["analytic"] = {"hardware": hw, "profile": str(prof_path)}
    specs = workload(size, model.config.vocab_size)
    verdict: dict[str, Any] = {}
    if "tokens" not in skip:  # a quarter of the requests: each is compared under the tie rule
        report["tokens"] = part_tokens(base, loaded, specs[: max(2, len(specs) // 4)], dry)
        t = report["tokens"]
        verdict["tokens"] = all(not t[k]["mismatches"] for k in ("immediate", "window=4"))
        verdict["no_waits"] = not t["waits"]
        write(args.out, report | {"verdict": verdict})
    if "decode" not in skip:
        report["decode"] = part_decode(base, loaded, size, prof)
        ratios = [r["graphs_over_analytic"] for r in report["decode"]]
        verdict["step_within_1.3x"] = max(ratios) <= TARGET
        verdict["worst_step_ratio"] = round(max(ratios), 3)
        write(args.out, report | {"verdict": verdict})
    if "windows" not in skip:
        report["windows"] = part_windows(base, loaded, specs, prof_path, size["windows"])
        w4 = next(r for r in report["windows"] if r["output"] == "window=4")
        verdict["window4_gain"] = round(w4["stream_gain"], 4)
        verdict["window4_gain_simulated"] = round(w4["simulated_gain"], 4)
    if "sim_check" not in skip:  # last: its brief calibration takes what time is left
        report["sim_check"] = str(part_sim_check(args, dry))
    report["verdict"] = verdict
    report["wall_s"] = time.perf_counter() - t0
    write(args.out, report)
    print(markdown(report))
    print(f"wrote {args.out / 'graph_check.json'} in {report['wall_s']:.0f} s")
    return 0 if verdict.get("tokens", True) and verdict.get("no_waits", True) else 1
