"""aiperf (NVIDIA's, `make setup-loadgen` puts it in `.venv-aiperf`): synthetic prompts of a
fixed length, a concurrency bounded by a request count and a duration, every record kept
(`--export-level raw`) so that each request's response id can be joined with the server's.

Token counts are the server's (`--use-server-token-count`, from `usage`): re-tokenizing a
random model's text gives other counts, which aiperf would otherwise flag as mismatches.
The hub is left online in its environment: in offline mode aiperf 0.13 looks a local
tokenizer folder up as a hub repo id and fails; a local folder needs no network anyway.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from experiments.bench.loadgens import NAME, ClientRun, Job, run_logged

SUMMARY = "profile_export_aiperf.json"
RECORDS = "profile_export.jsonl"
RAW = "profile_export_raw.jsonl"
ENDPOINTS = ("chat", "completions")  # the ones driven here, the default first


def run(job: Job, exe: str | None) -> Path:
    """aiperf's artifact folder of one concurrency."""
    if not exe:
        raise SystemExit("aiperf not found: run `make setup-loadgen`, or give --aiperf PATH")
    folder = job.out / f"aiperf-c{job.streams}"
    cmd = [
        exe, "profile", "--model", NAME, "--url", job.base_url,
        "--endpoint-type", job.endpoint, "--streaming",
        "--tokenizer", str(job.tokenizer),
        "--isl", str(job.prompt_tokens), "--isl-stddev", "0",
        "--osl", str(job.output_tokens), "--extra-inputs", "ignore_eos:true",
        "--concurrency", str(job.streams), "--request-count", str(job.requests),
        "--benchmark-duration", f"{job.seconds:g}", "--random-seed", "0",
        "--use-server-token-count", "--artifact-dir", str(folder), "--export-level", "raw",
        "--ui", "none", "--no-gpu-telemetry",
    ]  # fmt: skip
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    log = job.out / f"aiperf-c{job.streams}.log"
    code = run_logged(cmd, job, log, env)
    if code != 0 or not (folder / SUMMARY).is_file():
        raise SystemExit(f"aiperf failed (exit {code}); see {log}")
    return folder


def response_id(raw: dict) -> str | None:
    """The response id in a raw record's first SSE data packet (or its whole-body answer)."""
    for response in raw.get("responses") or []:
        for packet in response.get("packets") or [{"value": response.get("text")}]:
            try:
                body = json.loads(packet.get("value") or "")
            except (TypeError, ValueError):
                continue
            if isinstance(body, dict) and body.get("id"):
                return str(body["id"])
    return None


def parse(folder: Path) -> ClientRun:
    """Completed requests by response id; failed: the counts of aiperf's error summary;
    throughput: its output token throughput."""
    summary = json.loads((folder / SUMMARY).read_text())
    ids = {}
    with (folder / RAW).open() as f:
        for line in f:
            raw = json.loads(line)
            ids[raw["metadata"]["x_request_id"]] = response_id(raw)
    got = ClientRun(
        failed=sum(int(e["count"]) for e in summary.get("error_summary") or []),
        output_tok_s=(summary.get("output_token_throughput") or {}).get("avg"),
    )
    with (folder / RECORDS).open() as f:
        for line in f:
            record = json.loads(line)
            metrics = record.get("metrics") or {}
            if record.get("error") or "time_to_first_token" not in metrics:
                continue
            got.completed += 1
            rid = ids.get(record["metadata"]["x_request_id"])
            if rid is None:
                continue
            itl = metrics.get("inter_token_latency")
            tokens = metrics.get("usage_completion_tokens") or metrics.get("output_sequence_length")
            got.requests[rid] = {
                "ttft": metrics["time_to_first_token"]["value"] / 1000,
                "itl": None if itl is None else itl["value"] / 1000,
                "tokens": None if tokens is None else tokens["value"],
            }
    return got
