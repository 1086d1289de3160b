"""Behaviour before and after a change: every count of `metrics.json` and every output token of a
fixed set of runs, at a git ref and in the working tree, compared exactly.

    python -m experiments.same_behaviour --base HEAD          # the working tree against HEAD
    python -m experiments.same_behaviour --base main~3 --cases preempting,disaggregated

A restructuring of the engine (a seam moved, a mixin turned into an object, one release path)
must change nothing a run counts or produces. Each case is one `python run.py` on the tiny
model, `observers=[console]`, in a worktree of `--base` and in this tree, with this tree's
interpreter; the cases cover what a refactor of the step tends to break: a static batch, a
preempting pool, the prefix cache with chunked prefill and a deferred window, priority
displacement, chunked prefill with recomputation under a deferred window, SJF with a
deferred window and worst-case reservations, a simulated disaggregated cluster (hand-offs and
their releases), a Mooncake trace slice on the prefix cache, alone and on a three-replica
cluster behind the prefix-aware router, a replica's failure with tokens held on its device
(its requests re-routed), and the server's tokens for a fixed set of requests.
Times are not compared (they are this machine's). Writes `same_behaviour.md`; exits 1 when
any case differs, naming the first difference.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from experiments.toolkit import cli
from framework.run.paths import OUTPUTS, ROOT
from framework.run.summary import COUNT_KEYS
from framework.tracking.tool_run import command_line

MOONCAKE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_conversation.jsonl"
CASES: dict[str, list[str]] = {
    "static": ["workload=straggler", "scheduler=static", "engine.max_num_seqs=4"],
    "preempting": [
        "workload=fixed",
        "workload.prompt_lens=[24,24,24,24,24,24]",
        "workload.output_lens=[40,8,32,16,40,24]",
        "engine.max_num_seqs=6",
        "engine.num_blocks=10",
        "engine.block_size=16",
    ],
    "prefix_chunked_deferred": [
        "workload=chat",
        "workload.limit=12",
        "allocator=prefix_cache",
        "scheduler=chunked",
        "output=deferred",
        "window=4",
        "engine.block_size=4",
        "engine.num_blocks=60",
    ],
    "priority_displace": [
        "workload=fixed",
        "workload.prompt_lens=[20,20,20,20,8]",
        "workload.output_lens=[30,30,30,30,10]",
        "workload.priorities=[1,1,1,1,0]",
        "workload.arrivals=[0,0,0,0,0.001]",
        "scheduler=priority",
        "preemption=priority",
        "engine.num_blocks=12",
        "engine.block_size=8",
    ],
    "disaggregated": [
        "executor=simulated",
        "workload=straggler",
        "cluster.replicas=2",
        "cluster.roles=[prefill,decode]",
        "cluster.link=ethernet",
        "engine.block_size=4",
        "executor.mean_output_tokens=4",
    ],
    "mooncake_prefix": [
        "executor=simulated",
        "workload=mooncake",
        f"workload.path={MOONCAKE}",
        "workload.limit=40",
        "allocator=prefix_cache",
        "engine.block_size=16",
    ],
    "cluster_prefix_aware": [
        "executor=simulated",
        "workload=mooncake",
        f"workload.path={MOONCAKE}",
        "workload.limit=60",
        "cluster.replicas=3",
        "router=prefix_aware",
        "allocator=prefix_cache",
        "scheduler=lpm",
        "engine.block_size=16",
    ],
    "failover": [  # a replica lost with tokens held on its device, its requests re-routed
        "executor=simulated",
        "executor.host_time=model",  # the clock the failure is timed on: no measured seconds
        "workload=chat",
        "cluster.replicas=3",
        "cluster.faults=[{replica: 1, down_at_s: 0.003, up_at_s: 0.006}]",
        "output=deferred",
        "window=2",
    ],
    "sjf_deferred_worst_case": [  # deferred, not adaptive: the adaptive window reads times
        "workload=chat",
        "workload.limit=10",
        "scheduler=sjf",
        "allocator=worst_case",
        "output=deferred",
        "window=3",
        "engine.num_blocks=40",
        "engine.block_size=8",
    ],
    "chunked_recompute_deferred": [
        "workload=fixed",
        "workload.prompt_lens=[40,33,17,50,9,28]",
        "workload.output_lens=[12,20,6,16,24,10]",
        "scheduler=chunked",
        "scheduler.chunk_size=16",
        "output=deferred",
        "window=2",
        "engine.num_blocks=14",
        "engine.block_size=8",
    ],
}
# The server: `serve.py` on a free port of 127.0.0.1, these completions sent one by one (greedy),
# then it stops by itself after the last; the tokens of each are compared (its counts of steps
# and transfers depend on when each request reached it).
SERVER_REQUESTS = [
    {"prompt": "The capital of France is", "max_tokens": 9},
    {"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True},
    {"prompt": "1, 2, 3, 4,", "max_tokens": 5},
    {"prompt": "def add(a, b):", "max_tokens": 12, "ignore_eos": True},
]


def observe(tree: Path, overrides: list[str], folder: Path) -> dict[str, Any]:
    """One run of `tree`'s run.py: its counts and each request's output tokens."""
    proc = subprocess.run(
        [sys.executable, str(tree / "run.py"), "model=tiny", *overrides,
         "observers=[console]", f"hydra.run.dir={folder}"],
        capture_output=True, text=True, cwd=folder.parent,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return {"failed": f"exit {proc.returncode}: {' '.join(tail)}"}
    metrics = json.loads((folder / "metrics.json").read_text())
    lines = (folder / "outputs.jsonl").read_text().splitlines()
    return {
        "counts": {k: metrics.get(k) for k in COUNT_KEYS},
        "tokens": {o["id"]: o["output_token_ids"] for o in map(json.loads, lines)},
    }


def observe_server(tree: Path, folder: Path) -> dict[str, Any]:
    """`tree`'s serve.py, sent `SERVER_REQUESTS`: each request's output tokens."""
    n = len(SERVER_REQUESTS)
    proc = subprocess.Popen(
        [sys.executable, str(tree / "serve.py"), "model=tiny", "server.port=0",
         f"server.stop_after_requests={n}", "server.stop_after_s=300", "observers=[console]",
         f"hydra.run.dir={folder}"],
        cwd=folder.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = None
        assert proc.stdout is not None
        while port is None:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                return {"failed": f"exit {proc.returncode} before serving"}
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        for body in SERVER_REQUESTS:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                data=json.dumps({**body, "temperature": 0}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as answer:
                answer.read()
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}"}
    lines = (folder / "outputs.jsonl").read_text().splitlines()
    outputs = [json.loads(line)["output_token_ids"] for line in lines]
    return {"counts": {"requests": len(outputs)}, "tokens": dict(enumerate(outputs))}


def first_difference(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """None when both runs counted and produced the same, else what differs first."""
    for side, got in (("base", before), ("this tree", after)):
        if "failed" in got:
            return f"{side}'s run failed: {got['failed']}"
    for key, value in before["counts"].items():
        if value is None:  # a count the base does not report (added since): nothing to compare
            continue
        if after["counts"].get(key) != value:
            return f"{key}: {value} at the base, {after['counts'].get(key)} here"
    for rid, tokens in before["tokens"].items():
        if after["tokens"].get(rid) != tokens:
            return f"{rid}'s tokens differ"
    extra = set(after["tokens"]) - set(before["tokens"])
    return f"requests only here: {sorted(extra)[:3]}" if extra else None


def worktree(ref: str, where: Path) -> Path:
    """A detached worktree of `ref` under `where` (removed by `drop_worktree`)."""
    path = where / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(path), ref],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(
        ["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True
    )


def compare(ref: str, cases: list[str], out: Path) -> dict[str, str | None]:
    """Each case's first difference between `ref` and this tree (None: identical)."""
    found: dict[str, str | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = worktree(ref, Path(tmp))
        try:
            for name in cases:
                runs = {}
                for side, tree in (("base", base), ("here", ROOT)):
                    folder = out / side / name
                    folder.parent.mkdir(parents=True, exist_ok=True)
                    if name == "server":
                        runs[side] = observe_server(tree, folder)
                    else:
                        runs[side] = observe(tree, CASES[name], folder)
                found[name] = first_difference(runs["base"], runs["here"])
                print(f"{name}: {found[name] or 'identical'}", flush=True)
        finally:
            drop_worktree(base)
    return found


def main(argv: list[str] | None = None) -> dict[str, str | None]:
    ap = cli.parser(__doc__)
    ap.add_argument("--base", default="HEAD", help="git ref to compare against (HEAD)")
    ap.add_argument(
        "--cases",
        type=cli.comma_list([*CASES, "server"]),
        default=[*CASES, "server"],
        help="a subset, by name",
    )
    cli.add_out(ap, OUTPUTS / "same_behaviour")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    found = compare(args.base, args.cases, out)
    lines = [
        "# nanoserve: the same behaviour",
        "",
        f"- command: `{command_line('same_behaviour', argv)}`",
        f"- base: `{args.base}` against the working tree; tiny model; counts and tokens",
        "",
        "| case | result |",
        "|---|---|",
        *[f"| {name} | {diff or 'identical'} |" for name, diff in found.items()],
    ]
    (out / "same_behaviour.md").write_text("\n".join(lines) + "\n")
    if any(found.values()):
        sys.exit(1)
    return found
