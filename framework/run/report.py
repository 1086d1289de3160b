"""The files every run leaves in its Hydra run directory (a stable interface for scripts).

`metrics.json` always says whether the run finished: `"incomplete": false` after a whole
run; after a run stopped early (an error, Ctrl-C), `"incomplete": true` and `"error":
"<type>: <message>"`, and every file holds what was measured up to the stop.

A long run's `steps.csv` and `outputs.jsonl` are written gzipped (`steps.csv.gz`,
`outputs.jsonl.gz`; `results.compress`): `framework.tracking.run_files` finds either.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from framework.cluster.result import ClusterResult
from framework.run.outputs_jsonl import write_outputs
from framework.run.steps_csv import write_steps
from framework.run.summary import request_row

if TYPE_CHECKING:
    from framework.engine.loop import RunResult


# `results.compress=auto` gzips steps.csv and outputs.jsonl past these (about 30 MB of each).
COMPRESS_STEPS = 200_000
COMPRESS_TOKENS = 5_000_000


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def write_results(
    out: Path, cfg: DictConfig, result: RunResult, summary: dict[str, Any], texts: dict[str, str]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    rows = [request_row(s) for s in result.seqs]
    cluster = result if isinstance(result, ClusterResult) else None
    if cluster is not None:  # which replica served each request
        placed = cluster.replicas_of or {}
        for row in rows:
            row["replica"] = cluster.replica_of.get(row["id"])
            # every replica it was placed on, in order: more than one after a failure
            row["replicas"] = " ".join(map(str, placed.get(row["id"], [row["replica"]])))
    if cluster is not None and cluster.transfers is not None:  # disaggregated: where each
        decode_of = cluster.decode_of or {}  # was decoded, and its transfer
        moved = {t.id: t for t in cluster.transfers}
        for row in rows:
            t = moved.get(row["id"])
            row["decode_replica"] = decode_of.get(row["id"], "")
            row["kv_wait_s"] = "" if t is None else t.wait_s
            row["kv_transfer_s"] = "" if t is None else t.seconds
            row["kv_start_s"] = "" if t is None else t.start  # on the run's time axis
            row["kv_done_s"] = "" if t is None else t.done_at
    _write_csv(out / "requests.csv", rows)
    gz, other = (".gz", "") if compressed(cfg, result) else ("", ".gz")
    for name in ("steps.csv", "outputs.jsonl"):  # the other form, from a rerun into the folder
        (out / f"{name}{other}").unlink(missing_ok=True)
    replicas = cluster.step_replicas if cluster is not None else None
    write_steps(out / f"steps.csv{gz}", result.steps, replicas=replicas)
    write_outputs(out / f"outputs.jsonl{gz}", result.seqs, texts)


def compressed(cfg: DictConfig, result: RunResult) -> bool:
    """Whether steps.csv and outputs.jsonl are written gzipped (`results.compress`): always,
    never, or (`auto`) for a run past `COMPRESS_STEPS` steps or `COMPRESS_TOKENS` token ids,
    where the two files run to hundreds of MB."""
    setting = str(cfg.get("results", {}).get("compress", "auto")).lower()
    if setting != "auto":
        return setting == "true"
    tokens = sum(len(s.spec.prompt_token_ids) + len(s.output_token_ids) for s in result.seqs)
    return len(result.steps) > COMPRESS_STEPS or tokens > COMPRESS_TOKENS


def error_text(error: BaseException) -> str:
    """`<type>: <message>`, or just the type when there is no message (Ctrl-C)."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def mark_complete(summary: dict[str, Any]) -> dict[str, Any]:
    """Mark a whole run's summary (in place, and returned)."""
    summary.pop("error", None)
    summary["incomplete"] = False
    return summary


def mark_incomplete(summary: dict[str, Any], error: BaseException) -> dict[str, Any]:
    """Mark the summary of a run stopped by `error` (in place, and returned)."""
    summary["incomplete"] = True
    summary["error"] = error_text(error)
    return summary


def write_marker(out: Path, summary: dict[str, Any]) -> None:
    """Only metrics.json: for a run whose partial results could not be gathered."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def decode_outputs(tokenizer: Any, result: RunResult) -> dict[str, str]:
    """Each request's answer as text. A fast tokenizer that cleans up no spaces decodes them
    all in one call of its Rust backend (what its `decode` does one at a time: a whole day's
    trace is 19,366 answers, decoded several times faster so); any other, one `decode` each."""
    ids = [s.output_token_ids for s in result.seqs]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", None) is False:
        texts = backend.decode_batch(ids, skip_special_tokens=True)
    else:
        texts = [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    return {s.id: text for s, text in zip(result.seqs, texts, strict=True)}
