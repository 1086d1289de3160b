"""Workloads: configs in, `list[RequestSpec]` out, sorted by arrival.

A workload is chosen by its `kind` (chat, fixed, jsonl, mooncake, multiturn, shared_prefix,
synthetic, trace); presets such as `straggler` are YAML files in `conf/workload/` that reuse a
kind's schema. Every builder returns requests with ids `r0, r1, ...` in the workload's own order
and seeds `seed + i`, and `build_workload` then sorts them by arrival (stably, so simultaneous
requests keep that order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.workloads.chat import build_chat, check_chat
from framework.workloads.common import check_sampling, sort_by_arrival
from framework.workloads.config import (
    SCHEMAS,
    ChatWorkloadConfig,
    FixedWorkloadConfig,
    JsonlWorkloadConfig,
    MooncakeWorkloadConfig,
    MultiturnWorkloadConfig,
    SharedPrefixWorkloadConfig,
    SyntheticWorkloadConfig,
    TraceWorkloadConfig,
    WorkloadConfig,
    as_config,
    register_workload_configs,
)
from framework.workloads.fixed import build_fixed, check_fixed
from framework.workloads.jsonl import build_jsonl, read_jsonl
from framework.workloads.mooncake import build_mooncake, mooncake_rows, mooncake_sizes
from framework.workloads.multiturn import build_multiturn, multiturn_sizes
from framework.workloads.shared_prefix import build_shared_prefix, shared_prefix_sizes
from framework.workloads.synthetic import build_synthetic, synthetic_shape
from framework.workloads.trace import build_trace, trace_rows, trace_sizes

__all__ = [
    "ChatWorkloadConfig",
    "FixedWorkloadConfig",
    "JsonlWorkloadConfig",
    "MooncakeWorkloadConfig",
    "MultiturnWorkloadConfig",
    "SharedPrefixWorkloadConfig",
    "SyntheticWorkloadConfig",
    "TraceWorkloadConfig",
    "WorkloadConfig",
    "build_workload",
    "check_workload",
    "register_workload_configs",
]

_BUILDERS: dict[str, Callable[[Any, PreTrainedTokenizerBase], list[RequestSpec]]] = {
    "chat": build_chat,
    "fixed": build_fixed,
    "jsonl": build_jsonl,
    "mooncake": build_mooncake,
    "multiturn": build_multiturn,
    "shared_prefix": build_shared_prefix,
    "synthetic": build_synthetic,
    "trace": build_trace,
}
assert _BUILDERS.keys() == SCHEMAS.keys()


def build_workload(cfg: Any, tokenizer: PreTrainedTokenizerBase) -> list[RequestSpec]:
    """The requests of workload `cfg` (DictConfig, dict or dataclass), sorted by arrival.

    Raises ValueError / FileNotFoundError with a message naming the offending
    `workload.<field>` (or file and line) and what would be accepted.
    """
    typed = as_config(cfg)
    check_sampling(typed)
    return sort_by_arrival(_BUILDERS[typed.kind](typed, tokenizer))


def check_workload(cfg: Any) -> list[int] | None:
    """Every check a workload's builder makes that needs no tokenizer, run before the model
    loads: field types and ranges, files, rows and lines (with file and line numbers).

    Returns each request's prompt + max_tokens when they are known without tokenizing
    (fixed, mooncake, multiturn, shared_prefix, synthetic, trace), so the KV pool can be checked
    before loading too; None for workloads whose prompts are text (chat, jsonl).
    """
    typed = as_config(cfg)
    check_sampling(typed)
    if isinstance(typed, ChatWorkloadConfig):
        check_chat(typed)
    elif isinstance(typed, FixedWorkloadConfig):
        check_fixed(typed)
        return [p + o for p, o in zip(typed.prompt_lens, typed.output_lens, strict=True)]
    elif isinstance(typed, JsonlWorkloadConfig):
        read_jsonl(typed)
    elif isinstance(typed, MooncakeWorkloadConfig):
        return mooncake_sizes(typed, mooncake_rows(typed))
    elif isinstance(typed, MultiturnWorkloadConfig):
        return multiturn_sizes(typed)
    elif isinstance(typed, SharedPrefixWorkloadConfig):
        return shared_prefix_sizes(typed)
    elif isinstance(typed, SyntheticWorkloadConfig):
        prompt_lens, output_lens, _ = synthetic_shape(typed)
        return (prompt_lens + output_lens).tolist()
    elif isinstance(typed, TraceWorkloadConfig):
        return trace_sizes(typed, trace_rows(typed))
    return None
