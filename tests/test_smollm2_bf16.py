"""bfloat16 as a first-class dtype on CPU: SmolLM2's greedy output in bf16 equals Hugging
Face `generate` in bf16 (never fp32), under the bf16 tie rule (`framework.run.greedy_check`:
four units in the last place of the largest logit; every accepted tie is printed), for every
scheduler x allocator, through the kernels this machine chose (packed or stock Linear layers,
the paged decode kernel or gather + SDPA). Marked slow; CI runs it.

On a CPU without native bf16 (no AVX512-BF16 or AMX) bf16 is emulated and several times
slower than fp32 there: only the reference combination and a preempting pool run."""

from __future__ import annotations

import dataclasses
from itertools import product

import pytest
import torch

from framework.executors.model_loader import load_model
from framework.run.summary import summarize
from framework.tracking.machine import isa_flags
from framework.workloads import build_workload
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, run_engine

pytestmark = pytest.mark.slow
# New tokens per request: as few as still make the 14-block pool preempt (asserted below),
# since every decode step of every case, and of the batch-1 references, is a full forward of
# the real model in bf16 (emulated, and several times slower, on a CPU without native bf16).
NEW = 16
NATIVE = isa_flags()["avx512_bf16"] or isa_flags()["amx_bf16"]
SCHEDULERS = ("static", "continuous", "sjf", "priority", "chunked", "lpm")
ALLOCATORS = ("worst_case", "incremental", "prefix_cache")
COMBOS = [
    (s, a, ())
    for s, a in product(SCHEDULERS, ALLOCATORS)
    if NATIVE or (s, a) == ("continuous", "incremental")
]
# A pool tight enough to preempt (recompute), and chunks smaller than every prompt.
COMBOS += [("continuous", "incremental", ("engine.num_blocks=14",))]
COMBOS += [("chunked", "incremental", ("scheduler.chunk_size=7",))]


@pytest.fixture(scope="module")
def bf16(shared):
    model, tok = load_model("smollm2", None, None, torch.bfloat16, torch.device("cpu"))
    specs = build_workload({"kind": "chat", "limit": 8, "max_tokens": NEW}, tok)
    specs = [
        dataclasses.replace(s, sampling=dataclasses.replace(s.sampling, ignore_eos=True))
        for s in specs
    ]
    key = ["smollm2", "bfloat16", NEW, [s.prompt_token_ids for s in specs]]
    refs = shared.get(
        key, lambda: {s.id: hf_greedy(model, s.prompt_token_ids, NEW, None) for s in specs}
    )
    return model, tok, specs, refs


@pytest.mark.parametrize(("scheduler", "allocator", "extra"), COMBOS)
def test_bf16_greedy_matches_hf_bf16(bf16, scheduler, allocator, extra) -> None:
    model, tok, specs, refs = bf16
    assert next(model.parameters()).dtype == torch.bfloat16
    cfg = make_cfg(
        "model=smollm2",
        "dtype=bfloat16",
        f"scheduler={scheduler}",
        f"allocator={allocator}",
        *extra,
    )
    res = run_engine(cfg, model, tok, specs)
    s = summarize(res)
    assert s["requests_finished"] == 8 and all(len(q.output_token_ids) == NEW for q in res.seqs)
    if "engine.num_blocks=14" in extra:
        assert s["preemptions"] > 0
    if "scheduler.chunk_size=7" in extra:
        assert s["prefill_chunks"] > 8
    for seq in res.seqs:
        check_same_greedy(
            model,
            seq.spec.prompt_token_ids,
            f"bf16 {scheduler}/{allocator}{'/' + ','.join(extra) if extra else ''} {seq.id}",
            seq.output_token_ids,
            refs[seq.id],
        )


def test_bf16_tokens_are_the_same_with_and_without_the_layer_glue(bf16) -> None:
    """The fused glue gives eager's bits in bf16 too, so the very same tokens (no tie rule);
    with the paged kernel set, the decode steps run the fused attention."""
    from framework.executors import layer_glue

    model, tok, specs, _ = bf16
    runs = {}
    try:
        for on in (True, False):
            cfg = make_cfg(
                "model=smollm2",
                "dtype=bfloat16",
                "engine.paged_kernel=true",
                f"engine.layer_glue={on}",
            )
            runs[on] = {q.id: q.output_token_ids for q in run_engine(cfg, model, tok, specs).seqs}
    finally:
        layer_glue.remove_glue(model)
    assert runs[True] == runs[False]
