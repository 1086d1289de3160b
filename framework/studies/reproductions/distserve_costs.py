"""DistServe's own step costs for OPT-13B on one A100-80GB, as nanoserve profiles: what the
`distserve_toy` reproduction runs beside its headline cells to tell a difference in step
costs from a difference in scheduling.

DistServe's simulator (`simdistserve`) prices each iteration from latencies it profiled on
A100-80GB GPUs and fitted, in milliseconds, per model and tensor-parallel degree:

- a prefill iteration: a + b x (prompt tokens) + c x (sum of each prompt's length squared);
- a decode iteration: a + b x (sum of the rows' context lengths) + c x (rows), with a second
  fit past a batch of 95 rows.

It has one such profile of its own engine (`profiler-a100-80g.distserve.json`) and one of
vLLM's (`profiler-a100-80g.vllm.json`), which prices its colocated baseline. Their terms are
step features nanoserve's measured profiles already price with (`has_prefill`,
`prefill_tokens`, `prefill_attn`; `has_decode`, `decode_ctx`, `decode_rows`), so each fit is
written here as a measured profile of the OPT-13B shape in fp16, with no host or sampling
cost beside it (the fits time whole iterations). The small-batch decode fit is the one
written: the reproduction's decode batches stay under 95 rows at the rates that decide its
cells (its runs report `mean_rows`). A step that mixes a prefill with decodes, which neither
engine's scheduler makes here (`scheduler=prefill_first`), is priced as their sum.

These profiles are a diagnosis, never the reproduction's cells: those use the analytic
profile every reproduction uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from framework.executors.simulated.cost import FORMAT

# simdistserve's fits, OPT-13B, TP 1, milliseconds (repository LLMServe/DistServe, commit
# 82831f1604cc6b10bebd360f6c437a07790dde9f, simdistserve/estimators/profile_data/).
SOURCE = (
    "LLMServe/DistServe @ 82831f1, simdistserve/estimators/profile_data/"
    "profiler-a100-80g.{distserve,vllm}.json, facebook/opt-13b, TP 1"
)
FITS_MS: dict[str, dict[str, tuple[float, float, float]]] = {
    "distserve": {
        "prefill": (18.10254647486372, 0.1019122572698738, 7.122264314252114e-06),
        "decode": (19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
    },
    "vllm": {
        "prefill": (22.052204789310185, 0.14050923870128956, 8.076584822611088e-06),
        "decode": (23.475041008414784, 0.000592934466077393, 0.060726861260369455),
    },
}
# The shape and dtype the fits are for, as a profile names them (`cost.model_id`).
MODEL_ID = "OPTForCausalLM-L40-H5120-A40-KV40-V50272"
DTYPE = "float16"


def profile(engine: str) -> dict[str, Any]:
    """The measured profile of `engine`'s fits (`distserve` or `vllm`)."""
    (pa, pb, pc), (da, db, dc) = FITS_MS[engine]["prefill"], FITS_MS[engine]["decode"]
    per = {
        "has_prefill": pa / 1e3,
        "prefill_tokens": pb / 1e3,
        "prefill_attn": pc / 1e3,
        "has_decode": da / 1e3,
        "decode_ctx": db / 1e3,
        "decode_rows": dc / 1e3,
    }
    return {
        "format": FORMAT,
        "kind": "measured",
        "meta": {
            "model_id": MODEL_ID,
            "dtype": DTYPE,
            "device_type": "cuda",
            "hardware": "a100-80gb",
            "source_fit": f"{SOURCE}: {engine}",
        },
        "forward": {"intercept_s": 0.0, "per": per},
        "sample": {"intercept_s": 0.0, "per": {}},
        "host": {"per_step_s": 0.0, "per_row_s": 0.0},
    }


def write_profiles(folder: Path) -> dict[str, Path]:
    """Both profiles as YAML files in `folder`, by engine name."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for engine in FITS_MS:
        path = folder / f"opt-13b-float16-a100-80gb.{engine}.yaml"
        path.write_text(yaml.safe_dump(profile(engine), sort_keys=False))
        out[engine] = path
    return out


def prefill_ms(engine: str, prompt: int) -> float:
    """One prompt's prefill iteration alone, in milliseconds, by the fit."""
    a, b, c = FITS_MS[engine]["prefill"]
    return a + b * prompt + c * prompt * prompt


def decode_ms(engine: str, rows: int, context: int) -> float:
    """A decode iteration of `rows` rows of `context` tokens each, in milliseconds."""
    a, b, c = FITS_MS[engine]["decode"]
    return a + b * rows * context + c * rows
