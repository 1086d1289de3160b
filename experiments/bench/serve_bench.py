"""A load generator nobody here wrote drives `python serve.py` on 127.0.0.1 at a few
concurrencies, each bounded in requests and seconds: guidellm (the default), aiperf or
inference-perf (`--tool`). Each request's TTFT and ITL as the client measured them are put
beside the server's own for the same request (its `requests.csv`, joined on the response
id), with their difference: what serialisation, the HTTP stack and the client add; and the
tool's completed and failed requests and output throughput beside the server's.

- client TTFT: the tool's, from sending the request to the first token's chunk;
- server TTFT: from the request's headers reaching the server to the token's release;
- ITL: the mean gap between a request's tokens, (last - first) / (tokens - 1), both sides;
- throughput: output tokens/s as the tool reports it; the server's, the joined requests'
  output tokens over the span from the first one's arrival to the last one's finish.

The server is one served run (its run folder under `--out`), the generator one run a
concurrency; every tool reads prompts' lengths with the served model's tokenizer folder.
A run with a failed request exits 1, after writing its table.
"""

from __future__ import annotations

import csv
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.bench.loadgens import (
    NAME,
    ClientRun,
    Job,
    aiperf,
    executable,
    guidellm,
    inference_perf,
)
from experiments.toolkit.cli import (
    add_out,
    add_overrides,
    add_quick,
    comma_list,
    parser,
    positive_int,
)
from framework.run.paths import ROOT
from framework.tracking.tool_run import command_line

TOOLS = {"guidellm": guidellm, "aiperf": aiperf, "inference-perf": inference_perf}


def tokenizer_folder(overrides: list[str]) -> Path:
    """The served model's tokenizer: model.path for model=hf, else SmolLM2's."""
    from framework.executors.model_loader import prepare_smollm2

    for o in overrides:
        if o.startswith("model.path="):
            folder = Path(o.split("=", 1)[1]).expanduser()
            if (folder / "tokenizer.json").is_file() or (
                folder / "tokenizer_config.json"
            ).is_file():
                return folder
    return prepare_smollm2()


def start_server(out: Path, overrides: list[str], max_seconds: float) -> tuple[Any, int]:
    cmd = [
        sys.executable, "serve.py", *overrides, "server.port=0", f"server.model_name={NAME}",
        f"server.stop_after_s={max_seconds}", f"hydra.run.dir={out}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        found = re.search(r"serving \S+ on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    proc.kill()
    raise SystemExit(f"serve.py did not start (exit {proc.poll()}): {' '.join(cmd)}")


def stop_server(proc: Any) -> None:
    """SIGINT, as a user stops it (it drains, then writes its run folder); killed if it has
    not stopped within two minutes."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()


def server_requests(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The server's own figures by request id (its run folder's requests.csv)."""
    out = {}
    with (run_dir / "requests.csv").open() as f:
        for row in csv.DictReader(f):
            if not row["first_token_s"]:
                continue
            n = int(row["output_tokens"])
            first, last = float(row["first_token_s"]), float(row["finished_s"] or 0)
            out[row["id"]] = {
                "ttft": float(row["ttft_s"]),
                "itl": (last - first) / (n - 1) if n > 1 and row["finished_s"] else None,
                "tokens": n,
                "arrival": float(row["arrival_s"]),
                "finished": float(row["finished_s"]) if row["finished_s"] else None,
            }
    return out


def ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1000:.2f}"


def rate(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| tool | concurrency | completed | failed | requests joined | client tok/s "
        "| server tok/s | client TTFT p50 ms | server TTFT p50 ms | TTFT diff p50 ms "
        "| client ITL mean ms | server ITL mean ms | ITL diff mean ms |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r['tool']} | {r['concurrency']} | {r['completed']} | {r['failed']} | "
            f"{r['requests']} | {rate(r['client_output_tok_s'])} | "
            f"{rate(r['server_output_tok_s'])} | {ms(r['client_ttft_p50'])} | "
            f"{ms(r['server_ttft_p50'])} | {ms(r['ttft_diff_p50'])} | {ms(r['client_itl_mean'])} | "
            f"{ms(r['server_itl_mean'])} | {ms(r['itl_diff_mean'])} |"
        )
    return "\n".join(lines)


def server_rate(server: dict[str, Any], ids: list[str]) -> float | None:
    """The server's output tokens/s over the given requests: their tokens over the span from
    the first one's arrival to the last one's finish, on the server's clock."""
    done = [server[k] for k in ids if server[k]["finished"] is not None]
    if not done:
        return None
    span = max(r["finished"] for r in done) - min(r["arrival"] for r in done)
    return sum(r["tokens"] for r in done) / span if span > 0 else None


def compare(tool: str, streams: int, run: ClientRun, server: dict[str, Any]) -> dict[str, Any]:
    """One concurrency's row: the tool's figures beside the server's, request by request."""
    client = run.requests
    both = [k for k in client if k in server]
    if not both:
        raise SystemExit(f"{tool}, concurrency {streams}: no request of its is in requests.csv")
    for k in both:  # the same requests: the same token counts on both sides
        if client[k]["tokens"] is not None and client[k]["tokens"] != server[k]["tokens"]:
            raise SystemExit(f"{k}: {tool} counted {client[k]['tokens']} tokens, the server "
                             f"{server[k]['tokens']}")  # fmt: skip
    itl = [k for k in both if client[k]["itl"] is not None and server[k]["itl"] is not None]

    def mean(values: list[Any]) -> float | None:
        return statistics.fmean(values) if values else None

    return {
        "tool": tool,
        "concurrency": streams,
        "completed": run.completed,
        "failed": run.failed,
        "requests": len(both),
        "client_output_tok_s": run.output_tok_s,
        "server_output_tok_s": server_rate(server, both),
        "client_ttft_p50": statistics.median(client[k]["ttft"] for k in both),
        "server_ttft_p50": statistics.median(server[k]["ttft"] for k in both),
        "ttft_diff_p50": statistics.median(client[k]["ttft"] - server[k]["ttft"] for k in both),
        "client_itl_mean": mean([client[k]["itl"] for k in itl]),
        "server_itl_mean": mean([server[k]["itl"] for k in itl]),
        "itl_diff_mean": mean([client[k]["itl"] - server[k]["itl"] for k in itl]),
    }


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--tool", choices=sorted(TOOLS), default="guidellm")
    ap.add_argument("--endpoint", choices=["chat", "completions"],
                    help="the requests' endpoint (default: the tool's first; guidellm: chat, "
                    "aiperf: chat or completions, inference-perf: completions)")  # fmt: skip
    ap.add_argument("--aiperf", help="aiperf's executable (default: .venv-aiperf's, or PATH's)")
    ap.add_argument("--inference-perf", dest="inference_perf",
                    help="inference-perf's executable (default: .venv-inference-perf's, or "
                    "PATH's)")  # fmt: skip
    ap.add_argument("--concurrency", type=comma_list(), default=["1", "2", "4"])
    ap.add_argument("--requests", type=positive_int, default=16, help="a concurrency's, at most")
    ap.add_argument("--seconds", type=float, default=60.0, help="a concurrency's, at most")
    ap.add_argument("--prompt-tokens", type=positive_int, default=128)
    ap.add_argument("--output-tokens", type=positive_int, default=64)
    add_out(ap, ROOT / "outputs" / "serve_bench")
    add_quick(ap)
    add_overrides(ap, "Hydra overrides of the served run (serve.py's)")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tool = TOOLS[args.tool]
    endpoint = args.endpoint or tool.ENDPOINTS[0]
    if endpoint not in tool.ENDPOINTS:
        raise SystemExit(f"{args.tool} is driven on {', '.join(tool.ENDPOINTS)} requests here")
    exe = None
    if args.tool != "guidellm":
        exe = executable(args.tool, getattr(args, args.tool.replace("-", "_")))
        if exe is None:
            raise SystemExit(f"{args.tool} not found: run `make setup-loadgen`, or give "
                             f"--{args.tool} PATH")  # fmt: skip
    overrides = [*(["model=tiny"] if args.quick else []), "observers=[]", *args.overrides]
    levels = [int(c) for c in args.concurrency]
    budget = len(levels) * (args.seconds + 120) + 300  # the server stops by itself after it
    tokenizer = tokenizer_folder(overrides)
    proc, port = start_server(out / "server", overrides, budget)
    try:
        files = {
            c: tool.run(Job(port, c, args.requests, args.seconds, args.prompt_tokens,
                            args.output_tokens, tokenizer, out, endpoint), exe)
            for c in levels
        }  # fmt: skip
    finally:
        stop_server(proc)
    if proc.returncode != 0:
        raise SystemExit(f"serve.py exited {proc.returncode}")
    server = server_requests(out / "server")
    rows = [compare(args.tool, c, tool.parse(files[c]), server) for c in levels]
    text = (
        f"`{command_line('serve_bench', argv)}`\n\n{table(rows)}\n\n"
        "completed, failed: the tool's counts; requests joined: those found in the server's "
        "requests.csv; tok/s: output tokens a second, the client's as the tool reports it, "
        "the server's over the joined requests. TTFT diff: client TTFT - server TTFT, per "
        "request (median); ITL diff: client ITL - server ITL, per request (mean).\n"
    )
    (out / "serve_bench.md").write_text(text)
    (out / "serve_bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text)
    failed = sum(r["failed"] for r in rows)
    if failed:
        raise SystemExit(f"{args.tool}: {failed} failed requests (see its logs under {out})")
