"""The load generators `serve_bench` drives `serve.py` with: guidellm, aiperf and
inference-perf, one module each. Every module turns the same `Job` into its tool's own
command line (`run`), and reads back what the tool wrote (`parse`) into one shape,
`ClientRun`, so that the table beside the server's own figures is the same whichever tool
measured it.

guidellm runs from the project's environment (the `bench` extra). aiperf and inference-perf
cannot be installed beside the project (aiperf pins older huggingface_hub, rich, pandas and
pillow than the project's; inference-perf needs Python >= 3.12 and pins transformers), so
each runs from a virtual environment of its own, made by `make setup-loadgen`, and is found
by its executable (`executable`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.run.paths import ROOT

NAME = "bench"  # the served model's name, as every tool asks for it


@dataclass(frozen=True)
class Job:
    """One tool run against the server: one concurrency, bounded in requests and seconds."""

    port: int
    streams: int
    requests: int
    seconds: float
    prompt_tokens: int
    output_tokens: int
    tokenizer: Path  # the served model's tokenizer folder, read locally
    out: Path  # the folder the tool writes its files under
    endpoint: str = "chat"  # "chat" or "completions"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class ClientRun:
    """What a tool measured: its completed requests by response id (`ttft`, `itl` in
    seconds, `tokens` the output tokens it counted), how many failed, and its own
    output throughput (tokens/s, as the tool computes it)."""

    requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # float or None each
    completed: int = 0
    failed: int = 0
    output_tok_s: float | None = None


def venv_executable(tool: str) -> Path:
    """Where `make setup-loadgen` puts a tool: `.venv-<tool>/bin/<tool>` in the checkout."""
    return ROOT / f".venv-{tool}" / "bin" / tool


def executable(tool: str, given: str | None) -> str | None:
    """The tool's executable: the one given (`--aiperf PATH`), else the one of its own
    venv, else one on PATH; None when there is none."""
    if given:
        return given
    own = venv_executable(tool)
    if own.is_file():
        return str(own)
    return shutil.which(tool)


def run_logged(cmd: list[str], job: Job, log: Path, env: dict[str, str]) -> int:
    """Runs a tool with its output in `log`, killed past the job's seconds plus two minutes
    (a tool's own start and report take that)."""
    with log.open("w") as f:
        try:
            done = subprocess.run(cmd, cwd=job.out, env=env, stdout=f,
                                  stderr=subprocess.STDOUT, timeout=job.seconds + 120)  # fmt: skip
        except subprocess.TimeoutExpired:
            return 124
    return done.returncode


def offline_env() -> dict[str, str]:
    """The environment, with the Hugging Face hub offline: the tokenizer is a local folder."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
