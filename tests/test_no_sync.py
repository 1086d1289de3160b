"""No call that would make the host wait for a GPU inside a step's forward, and one per drain
of the held tokens (`SyncWatch`: reads of device values, boolean indexing, blocking copies),
on the tiny model: decode rows through nanoserve's paged kernel and through the gather path,
prefill over cached context (prefix caching, chunked prefill), held inputs under deferred
output, sampled rows with top-k and top-p, log-probabilities of a prompt and its answer, and
penalties and min_tokens."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.executors.sync_watch import SyncWatch, watched
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from tests.helpers import make_cfg, spec

pytestmark = pytest.mark.usefixtures("one_thread")

SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def workload() -> list[RequestSpec]:
    sampled = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3, max_tokens=7)
    return [
        *(spec(i, [5 + i] * (3 + 2 * i), 6 + i, arrival=0.0) for i in range(4)),
        spec(4, [*SHARED, 1, 2], 5),
        spec(5, [*SHARED, 3, 4, 5], 5),  # its head cached by r4's (prefix caching)
        RequestSpec("s", [7] * 9, sampled),
        # log-probabilities of a drawn answer and of its prompt (`framework.engine.scores`)
        RequestSpec("l", [*SHARED, 6], replace(sampled, logprobs=3, prompt_logprobs=2)),
        # penalties and min_tokens, drawn and greedy (`framework.executors.penalties`)
        RequestSpec(
            "p",
            [*SHARED, 8, 8],
            replace(
                sampled,
                presence_penalty=0.5,
                frequency_penalty=0.3,
                repetition_penalty=1.2,
                min_tokens=3,
            ),
        ),
        RequestSpec(
            "q",
            [9, 9, 8, 9],
            SamplingParams(max_tokens=6, repetition_penalty=1.5, min_tokens=2, stop_token_ids=(9,)),
        ),
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        ("output=deferred", "window=2", "engine.paged_kernel=true"),
        ("engine.paged_kernel=false", "output=immediate"),
        ("allocator=prefix_cache", "scheduler=chunked", "scheduler.chunk_size=4"),
        ("output=adaptive", "engine.paged_kernel=false", "allocator=prefix_cache"),
        ("output=deferred", "window=3", "engine.cuda_graphs=true"),  # the decode buckets
    ],
)
def test_no_step_waits_and_each_drain_waits_once(tiny: tuple[Any, Any], overrides: tuple) -> None:
    model, tokenizer = tiny
    # The kernels not under watch are set, not measured (a measurement is seconds a choice).
    fixed = ("engine.packed_linears=false", "engine.argmax_kernel=true", "engine.layer_glue=true")
    cfg = make_cfg("model=tiny", "engine.block_size=4", "engine.max_num_seqs=3", *fixed, *overrides)
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    forwards: list[list[str]] = []
    drains: list[list[str]] = []
    engine.executor.execute = watched(engine.executor.execute, forwards)
    engine.readback.fetch = watched(engine.readback.fetch, drains)
    result = engine.run(workload(), tokenizer.eos_token_id)
    assert len(result.seqs) == len(workload()) and all(s.finish_reason for s in result.seqs)
    scored = next(s for s in result.seqs if s.id == "l")
    assert None not in scored.output_logprobs and None not in scored.prompt_logprobs[1:]
    assert forwards and not any(forwards), forwards
    assert drains and all(len(calls) <= 1 for calls in drains), drains


def test_the_watch_sees_what_would_wait() -> None:
    """Each kind of call it exists for is seen, with its place; a dtype change, an
    asynchronous copy and a library's same-device move are not."""
    x = torch.arange(6.0)
    with SyncWatch() as watch:
        x.sum().item()
        x.tolist()
        bool(x[0] > 1)
        x[x > 2]
        torch.nonzero(x)
        x.to("cpu")
        x.to(torch.float64)
        x.to("cpu", non_blocking=True)
    names = [c.split(" ")[0] for c in watch.calls]
    assert names == ["item", "tolist", "__bool__", "__getitem__", "nonzero", "to"]
    assert all("test_no_sync.py" in c for c in watch.calls)
