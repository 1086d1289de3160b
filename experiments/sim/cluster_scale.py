"""Scale of a simulated cluster: the Mooncake conversation trace on 1, 2, 4 and 8 replicas.

    python -m experiments.cluster_scale                      # the whole trace
    python -m experiments.cluster_scale --limit 2000 --replicas 1 4 router=prefix_aware

Each replica count is one `python run.py` of its own (the 8B shape on an analytic H100 per
replica, `allocator=prefix_cache`, chunked prefill, `executor.host_time=model`, the console
observer only), so its wall time is the whole command a user waits for (start, workload,
replay, the run folder written) and its peak RSS is its own (`os.wait4`). Reported per count:
requests, steps summed over the replicas, the virtual makespan, wall seconds, steps/s, wall
microseconds per replica-step, and the peak RSS. Writes `cluster_scale.csv` and
`cluster_scale.md` into `--out`. Seconds and memory describe this machine only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.toolkit import cli
from framework.run.paths import ROOT
from framework.tracking.tables import markdown_table, write_csv
from framework.tracking.tags import environment_tags

MOONCAKE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_conversation.jsonl"
BASE = [
    "executor=simulated",
    "executor.host_time=model",
    "model=hf",
    f"model.path={ROOT / 'framework' / 'executors' / 'simulated' / 'models' / 'llama-8b'}",
    "dtype=bfloat16",
    "workload=mooncake",
    "allocator=prefix_cache",
    "scheduler=chunked",
    "scheduler.chunk_size=2048",
    "engine.max_num_seqs=128",
    "engine.max_num_batched_tokens=8192",
    "engine.kv_memory_mb=61440",
    "observers=[console]",
    "print_outputs=false",
]


def run_one(replicas: int, limit: int | None, extra: list[str], folder: Path) -> dict:
    """One `run.py` at this replica count: its figures and its own peak RSS."""
    args = [
        sys.executable, "run.py", *BASE, f"workload.path={MOONCAKE}",
        f"workload.limit={'null' if limit is None else limit}",
        f"cluster.replicas={replicas}", f"hydra.run.dir={folder}", *extra,
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"replicas={replicas}: run.py exited {proc.returncode}:\n{err[-2000:]}")
    m = json.loads((folder / "metrics.json").read_text())
    steps = int(m["steps"])
    return {
        "replicas": replicas,
        "requests": m["requests"],
        "requests_finished": m["requests_finished"],
        "steps": steps,
        "makespan_s": round(m["makespan_s"], 1),
        "prefix_hit_rate": round(m["prefix_hit_rate"], 4),
        "wall_s": round(wall, 1),
        "steps_per_s": round(steps / wall),
        "us_per_replica_step": round(wall / steps * 1e6, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),  # ru_maxrss is in KiB on Linux
        "run_folder_mb": round(sum(p.stat().st_size for p in folder.iterdir()) / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--limit", type=int, default=None, help="requests of the trace (all)")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    cli.add_out(ap, ROOT / "outputs" / "cluster_scale")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides (router=..., ...)")
    args = ap.parse_args(argv)
    if not MOONCAKE.is_file():
        print(
            f"error: {MOONCAKE}: the Mooncake trace is not beside the repository", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.replicas:
            rows.append(run_one(n, args.limit, args.overrides, Path(tmp) / f"r{n}"))
            print(json.dumps(rows[-1]), flush=True)
    cols = list(rows[0])
    write_csv(rows, cols, args.out / "cluster_scale.csv")
    tags = environment_tags()
    text = (
        f"## Cluster scale: the Mooncake conversation trace\n\nMeasured "
        f"{time.strftime('%Y-%m-%d')} on {tags['machine.cpu']} ({tags['machine.cores']} "
        f"cores), commit {tags['git.commit'][:10]}; "
        f"`{' '.join(['python -m experiments.cluster_scale', *(argv or sys.argv[1:])])}`.\n\n"
        f"{markdown_table(rows, cols)}\n"
    )
    (args.out / "cluster_scale.md").write_text(text)
    print(text)
    return 0
