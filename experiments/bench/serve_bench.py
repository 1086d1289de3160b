"""A load generator nobody here wrote (guidellm, `pip install guidellm`) drives
`python serve.py` on 127.0.0.1 at a few concurrencies, each bounded in requests and
seconds; each request's TTFT and ITL as the client measured them are put beside the
server's own for the same request (its `requests.csv`, joined on the response id), with
their difference: what serialisation, the HTTP stack and the client add.

- client TTFT: guidellm's, from sending the request to the first token's chunk;
- server TTFT: from the request's headers reaching the server to the token's release;
- ITL: the mean gap between a request's tokens, (last - first) / (tokens - 1), both sides.

The server is one served run (its run folder under `--out`), the generator one run a
concurrency; guidellm reads prompts' lengths with the served model's tokenizer folder,
offline (`HF_HUB_OFFLINE=1`).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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

NAME = "bench"  # the served model's name, as guidellm asks for it


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


def run_guidellm(
    port: int, streams: int, requests: int, seconds: float, prompt: int, output: int,
    tokenizer: Path, out: Path,
) -> Path:  # fmt: skip
    path = out / f"guidellm-c{streams}.json"
    cmd = [
        sys.executable, "-m", "guidellm", "run",
        "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},model={NAME}",
        "--profile", f"kind=concurrent,streams={streams}",
        "--constraint", f"kind=max_requests,count={requests}",
        "--constraint", f"kind=max_duration,seconds={seconds:g}",
        "--data", f"kind=synthetic_text,prompt_tokens={prompt},output_tokens={output}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--output", f"kind=json,path={path}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = out / f"guidellm-c{streams}.log"
    with log.open("w") as f:
        done = subprocess.run(cmd, cwd=out, env=env, stdout=f, stderr=subprocess.STDOUT,
                              timeout=seconds + 120)  # fmt: skip
    if done.returncode != 0 or not path.is_file():
        raise SystemExit(f"guidellm failed (exit {done.returncode}); see {log}")
    return path


def client_requests(path: Path) -> dict[str, dict[str, float]]:
    """guidellm's completed requests by response id: TTFT and ITL in seconds."""
    data = json.loads(path.read_text())
    out = {}
    for bench in data["benchmarks"]:
        for r in bench["requests"]["successful"]:
            if r.get("response_id") and r.get("time_to_first_token_ms") is not None:
                itl = r.get("inter_token_latency_ms")
                out[r["response_id"]] = {
                    "ttft": r["time_to_first_token_ms"] / 1000,
                    "itl": None if itl is None else itl / 1000,
                    "tokens": r.get("output_tokens"),
                }
    return out


def server_requests(run_dir: Path) -> dict[str, dict[str, float]]:
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
            }
    return out


def ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1000:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| concurrency | requests | client TTFT p50 ms | server TTFT p50 ms | TTFT diff p50 ms "
        "| client ITL mean ms | server ITL mean ms | ITL diff mean ms |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['requests']} | {ms(r['client_ttft_p50'])} | "
            f"{ms(r['server_ttft_p50'])} | {ms(r['ttft_diff_p50'])} | {ms(r['client_itl_mean'])} | "
            f"{ms(r['server_itl_mean'])} | {ms(r['itl_diff_mean'])} |"
        )
    return "\n".join(lines)


def compare(streams: int, client: dict[str, Any], server: dict[str, Any]) -> dict[str, Any]:
    both = [k for k in client if k in server]
    if not both:
        raise SystemExit(f"concurrency {streams}: no request of guidellm's is in requests.csv")
    for k in both:  # the same requests: the same token counts on both sides
        if client[k]["tokens"] is not None and client[k]["tokens"] != server[k]["tokens"]:
            raise SystemExit(f"{k}: guidellm counted {client[k]['tokens']} tokens, the server "
                             f"{server[k]['tokens']}")  # fmt: skip
    itl = [k for k in both if client[k]["itl"] is not None and server[k]["itl"] is not None]

    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    return {
        "concurrency": streams,
        "requests": len(both),
        "client_ttft_p50": statistics.median(client[k]["ttft"] for k in both),
        "server_ttft_p50": statistics.median(server[k]["ttft"] for k in both),
        "ttft_diff_p50": statistics.median(client[k]["ttft"] - server[k]["ttft"] for k in both),
        "client_itl_mean": mean([client[k]["itl"] for k in itl]),
        "server_itl_mean": mean([server[k]["itl"] for k in itl]),
        "itl_diff_mean": mean([client[k]["itl"] - server[k]["itl"] for k in itl]),
    }


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
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
    overrides = [*(["model=tiny"] if args.quick else []), "observers=[]", *args.overrides]
    levels = [int(c) for c in args.concurrency]
    budget = len(levels) * (args.seconds + 120) + 300  # the server stops by itself after it
    proc, port = start_server(out / "server", overrides, budget)
    try:
        files = {
            c: run_guidellm(
                port,
                c,
                args.requests,
                args.seconds,
                args.prompt_tokens,
                args.output_tokens,
                tokenizer_folder(overrides),
                out,
            )
            for c in levels
        }
    finally:
        stop_server(proc)
    if proc.returncode != 0:
        raise SystemExit(f"serve.py exited {proc.returncode}")
    server = server_requests(out / "server")
    rows = [compare(c, client_requests(files[c]), server) for c in levels]
    text = (
        f"`{command_line('serve_bench', argv)}`\n\n{table(rows)}\n\n"
        "TTFT diff: client TTFT - server TTFT, per request (median); ITL diff: client ITL - "
        "server ITL, per request (mean).\n"
    )
    (out / "serve_bench.md").write_text(text)
    (out / "serve_bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text)
