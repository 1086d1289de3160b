"""The benchmark's peers: the same requests through Hugging Face transformers' own serving
paths, timed the way nanoserve's runs are.

- `hf_static`: static batching with `model.generate`. Requests are taken in arrival order,
  at most `max_batch` at a time, from those that have arrived when the previous batch ends
  (when none has, it waits for the next); each batch is left-padded to its longest prompt
  and generates the longest `max_tokens` of the batch, and each output is cut to its own
  length. A streamer stamps every decoding step, so the time of each token is real.
- `hf_cb`: transformers' continuous batching manager (`init_continuous_batching`), one
  `add_request` per request at its arrival time, at most `max_batch` requests per batch,
  with per-token timestamps (`record_timestamps`).

Both run greedy on the model as plain transformers runs it (sdpa attention and PyTorch's own
Linear layers, nanoserve's settings put back afterwards) with EOS
off, so every request produces exactly its `max_tokens` tokens, as in nanoserve.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.streamers import BaseStreamer

from framework.core.request import RequestSpec
from framework.core.step_stats import StepStats
from framework.executors.layer_glue import eager_glue
from framework.executors.packed_linear import stock_linears

CB_PAGE = 256  # tokens per page of transformers' continuous-batching cache (its default)


@dataclass
class Served:
    """What one system did with one workload: each request's tokens and, in seconds since
    the system's start, its arrival, first token and last token. A time the system does not
    expose is absent from its dict (and the `note` says so)."""

    outputs: dict[str, list[int]]
    arrival: dict[str, float]
    first: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # start to the last token of the last request
    steps: list[StepStats] = field(default_factory=list)  # nanoserve's steps; peers: none
    note: str = ""
    # Each request's text, where a server streams text rather than token ids (`outputs`
    # then lacks the request): an HTTP server's answer is compared by its text.
    texts: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # tokens, as a server counted them


class StepStamps(BaseStreamer):
    """A `generate` streamer that keeps the time of each decoding step. `generate` first
    hands it the prompt (ignored), then each step's new tokens, one step at a time."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@contextlib.contextmanager
def plain_hf(model: Any, stock_linear: bool = True) -> Iterator[Any]:
    """Run the model as plain transformers does, then put nanoserve's settings back: its
    own sdpa attention (the engine selects its paged attention on the model) and, with
    `stock_linear`, PyTorch's own Linear and its own eager norms, rotary and MLP (the engine
    packs the weights for oneDNN and may fuse the glue, `layer_glue.py`)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    linears = stock_linears(model) if stock_linear else contextlib.nullcontext(model)
    try:
        with linears, eager_glue(model) if stock_linear else contextlib.nullcontext(model):
            yield model
    finally:
        model.set_attn_implementation(previous)


def _left_padded(batch: list[RequestSpec], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s.prompt_token_ids) for s in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, s in enumerate(batch):
        n = len(s.prompt_token_ids)
        ids[i, width - n :] = torch.tensor(s.prompt_token_ids)
        mask[i, width - n :] = 1
    return ids, mask


def _generate_batch(
    model: Any, batch: list[RequestSpec], pad: int, t0: float, served: Served
) -> None:
    ids, mask = _left_padded(batch, pad)
    stamps = StepStamps()
    out = model.generate(
        ids.to(model.device),
        attention_mask=mask.to(model.device),
        max_new_tokens=max(s.sampling.max_tokens for s in batch),
        do_sample=False,
        eos_token_id=None,  # the keyword, not a GenerationConfig field: only it turns EOS off
        pad_token_id=pad,
        streamer=stamps,
    )
    for i, s in enumerate(batch):
        n = s.sampling.max_tokens
        served.outputs[s.id] = out[i, ids.shape[1] : ids.shape[1] + n].tolist()
        if len(stamps.times) >= n:
            served.first[s.id] = stamps.times[0] - t0
            served.finish[s.id] = stamps.times[n - 1] - t0


def hf_static(model: Any, specs: list[RequestSpec], max_batch: int, pad: int) -> Served:
    """Static padded batches through `generate`, served as they arrive (see the module)."""
    served = Served({}, {s.id: s.arrival for s in specs})
    queue = deque(sorted(specs, key=lambda s: s.arrival))
    with plain_hf(model), torch.inference_mode():
        t0 = time.perf_counter()
        while queue:
            wait = queue[0].arrival - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            now = time.perf_counter() - t0
            batch = []
            while queue and len(batch) < max_batch and queue[0].arrival <= now:
                batch.append(queue.popleft())
            if batch:  # (a sleep that woke a hair early takes nobody: wait again)
                _generate_batch(model, batch, pad, t0, served)
    served.wall_s = max(served.finish.values(), default=0.0)
    return served


def _cb_config(specs: list[RequestSpec], max_batch: int, max_batch_tokens: int) -> Any:
    longest = max(len(s.prompt_token_ids) + s.sampling.max_tokens for s in specs)
    return ContinuousBatchingConfig(
        max_requests_per_batch=max_batch,
        max_batch_tokens=max_batch_tokens,
        # Room for every batch slot's longest request: no request waits for cache pages.
        num_blocks=max_batch * math.ceil(longest / CB_PAGE) + 1,
        auto_switch_to_flash=False,  # the same sdpa kernels as the other systems
        allow_block_sharing=False,  # no prefix cache: nanoserve has none either
    )


def _collect(manager: Any, want: int, timeout_s: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    deadline = time.perf_counter() + timeout_s
    while len(results) < want and time.perf_counter() < deadline:
        r = manager.get_result(timeout=0.5)
        if r is not None and r.is_finished():
            if r.error is not None:
                raise RuntimeError(f"transformers CB: request {r.request_id} failed: {r.error}")
            results[r.request_id] = r
        elif r is None and not manager.is_running():
            raise RuntimeError("transformers CB: the generation thread stopped early")
    return results


def hf_cb(
    model: Any,
    specs: list[RequestSpec],
    max_batch: int,
    max_batch_tokens: int,
    pad: int,
    timeout_s: float = 3600.0,
) -> Served:
    """transformers' continuous batching, each request added at its arrival (see module)."""
    served = Served({}, {s.id: s.arrival for s in specs})
    gen = GenerationConfig(
        do_sample=False, eos_token_id=-1, pad_token_id=pad, max_new_tokens=1
    )  # eos -1: off
    with plain_hf(model):
        manager = model.init_continuous_batching(
            generation_config=gen,
            continuous_batching_config=_cb_config(specs, max_batch, max_batch_tokens),
        )
        manager.start()
        try:
            # Warm up outside the clock: the first request builds the cache and the batch
            # processor in the background thread.
            manager.add_request(specs[0].prompt_token_ids, "warmup", max_new_tokens=2)
            _collect(manager, 1, timeout_s)
            t0 = time.perf_counter()
            for s in sorted(specs, key=lambda s: s.arrival):
                wait = s.arrival - (time.perf_counter() - t0)
                if wait > 0:
                    time.sleep(wait)
                manager.add_request(
                    s.prompt_token_ids,
                    s.id,
                    max_new_tokens=s.sampling.max_tokens,
                    record_timestamps=True,
                    eos_token_id=-1,
                )
            results = _collect(manager, len(specs), timeout_s)
        finally:
            manager.stop(block=True)
    for rid, r in results.items():
        served.outputs[rid] = list(r.generated_tokens)
        if r.timestamps:
            served.first[rid] = r.timestamps[0] - t0
            served.finish[rid] = r.timestamps[-1] - t0
    missing = [s.id for s in specs if s.id not in results]
    if missing:
        served.note = f"no result for {', '.join(missing[:5])}"
    served.wall_s = max(served.finish.values(), default=0.0)
    return served
