"""guidellm (the `bench` extra): chat requests of synthetic text, a concurrent profile
bounded by `max_requests` and `max_duration`, one JSON file a run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.bench.loadgens import NAME, ClientRun, Job, offline_env, run_logged

ENDPOINTS = ("chat",)  # the ones driven here, the default first


def run(job: Job, exe: str | None = None) -> Path:
    """guidellm's JSON report of one concurrency (chat requests)."""
    path = job.out / f"guidellm-c{job.streams}.json"
    cmd = [
        *([exe] if exe else [sys.executable, "-m", "guidellm"]), "run",
        "--backend", f"kind=openai_http,target={job.base_url},model={NAME}",
        "--profile", f"kind=concurrent,streams={job.streams}",
        "--constraint", f"kind=max_requests,count={job.requests}",
        "--constraint", f"kind=max_duration,seconds={job.seconds:g}",
        "--data", f"kind=synthetic_text,prompt_tokens={job.prompt_tokens},"
                  f"output_tokens={job.output_tokens}",
        "--tokenizer", f"kind=huggingface_auto,model={job.tokenizer}",
        "--output", f"kind=json,path={path}",
        "--disable-console-interactive",
    ]  # fmt: skip
    log = job.out / f"guidellm-c{job.streams}.log"
    code = run_logged(cmd, job, log, offline_env())
    if code != 0 or not path.is_file():
        raise SystemExit(f"guidellm failed (exit {code}); see {log}")
    return path


def parse(path: Path) -> ClientRun:
    """Completed requests by response id; failed: guidellm's errored requests; throughput:
    its mean output tokens/s."""
    data = json.loads(path.read_text())
    got = ClientRun()
    for bench in data["benchmarks"]:
        done = bench["requests"]["successful"] or []
        got.completed += len(done)
        got.failed += len(bench["requests"]["errored"] or [])
        rate = bench["metrics"]["output_tokens_per_second"]["successful"]["mean"]
        got.output_tok_s = rate if got.output_tok_s is None else got.output_tok_s + rate
        for r in done:
            if r.get("response_id") and r.get("time_to_first_token_ms") is not None:
                itl = r.get("inter_token_latency_ms")
                got.requests[r["response_id"]] = {
                    "ttft": r["time_to_first_token_ms"] / 1000,
                    "itl": None if itl is None else itl / 1000,
                    "tokens": r.get("output_tokens"),
                }
    return got
