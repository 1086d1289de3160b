"""inference-perf (Kubernetes SIG Serving's; `make setup-loadgen` puts it in
`.venv-inference-perf`, on the Python >= 3.12 it requires): random token prompts of a fixed
length on completions (its random data makes no chat requests), a concurrent stage of a
fixed request count, every request reported (`per_request`), so that each one's response
id can be joined with the server's. Its config is written as JSON, which its YAML reader
takes as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.bench.loadgens import NAME, ClientRun, Job, offline_env, run_logged

SUMMARY = "summary_lifecycle_metrics.json"
PER_REQUEST = "per_request_lifecycle_metrics.json"
ENDPOINTS = ("completions",)  # its random data is for completions only


def config(job: Job, reports: Path) -> dict[str, Any]:
    """inference-perf's config for one concurrency."""

    def fixed(n: int) -> dict[str, Any]:
        return {"min": n, "max": n, "mean": n, "type": "fixed"}

    return {
        "api": {"type": job.endpoint.replace("completions", "completion"), "streaming": True},
        "server": {"type": "vllm", "model_name": NAME, "base_url": job.base_url,
                   "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(job.tokenizer)},
        "data": {"type": "random", "input_distribution": fixed(job.prompt_tokens),
                 "output_distribution": fixed(job.output_tokens)},
        "load": {"type": "concurrent", "num_workers": 1, "request_timeout": job.seconds,
                 "stages": [{"num_requests": job.requests, "concurrency_level": job.streams}]},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False,
                                         "per_request": True}},
        "storage": {"local_storage": {"path": str(reports)}},
    }  # fmt: skip


def run(job: Job, exe: str | None) -> Path:
    """inference-perf's report folder of one concurrency."""
    if not exe:
        raise SystemExit(
            "inference-perf not found: run `make setup-loadgen`, or give --inference-perf PATH"
        )
    folder = job.out / f"inference-perf-c{job.streams}"
    path = job.out / f"inference-perf-c{job.streams}.yml"
    path.write_text(json.dumps(config(job, folder), indent=2) + "\n")
    log = job.out / f"inference-perf-c{job.streams}.log"
    code = run_logged([exe, "--config_file", str(path)], job, log, offline_env())
    if code != 0 or not (folder / SUMMARY).is_file():
        raise SystemExit(f"inference-perf failed (exit {code}); see {log}")
    return folder


def response_id(record: dict[str, Any]) -> str | None:
    """The response id: in the first chunk of a stream, or in a whole answer's body."""
    chunks = (record["info"].get("response_metrics") or {}).get("response_chunks") or []
    for text in [*chunks, record.get("response") or ""]:
        text = text.removeprefix("data: ").split("\n", 1)[0]
        try:
            body = json.loads(text)
        except ValueError:
            continue
        if isinstance(body, dict) and body.get("id"):
            return str(body["id"])
    return None


def parse(folder: Path) -> ClientRun:
    """Completed requests by response id, their TTFT and ITL from the request's start and
    its tokens' arrival times; failed and throughput: its summary's."""
    summary = json.loads((folder / SUMMARY).read_text())
    done = summary["successes"]
    got = ClientRun(
        completed=int(done["count"]),
        failed=int(summary["failures"]["count"]),
        output_tok_s=(done.get("throughput") or {}).get("output_tokens_per_sec"),
    )
    for record in json.loads((folder / PER_REQUEST).read_text()):
        metrics = record["info"].get("response_metrics") or {}
        times = metrics.get("output_token_times") or []
        rid = response_id(record)
        if record.get("error") or not times or rid is None:
            continue
        usage = metrics.get("server_usage") or {}
        n = usage.get("completion_tokens") or metrics.get("output_tokens") or len(times)
        got.requests[rid] = {  # ITL as the server's: (last - first) / (tokens - 1)
            "ttft": times[0] - record["start_time"],
            "itl": (times[-1] - times[0]) / (n - 1) if n > 1 and len(times) > 1 else None,
            "tokens": n,
        }
    return got
