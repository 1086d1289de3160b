"""Requests of exactly the listed prompt and output lengths: the unit of scheduler experiments.

Output lengths are forced (`ignore_eos=True`), so a scenario such as the straggler preset
(seven short requests and one long one) plays out the same whatever the model says.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase

from framework.core.request import RequestSpec
from framework.workloads.common import request_id, require_at_least, sampling_for
from framework.workloads.config import FixedWorkloadConfig
from framework.workloads.text import exact_length_prompts


def check_fixed(cfg: FixedWorkloadConfig) -> None:
    """The lists agree in length and hold sensible values (no tokenizer needed)."""
    n = len(cfg.prompt_lens)
    arrivals = [0.0] * n if cfg.arrivals is None else list(cfg.arrivals)
    priorities = [0] * n if cfg.priorities is None else list(cfg.priorities)
    sizes = {"prompt_lens": n, "output_lens": len(cfg.output_lens)}
    # The optional lists must match too when given; absent ones are filled to fit.
    if cfg.arrivals is not None:
        sizes["arrivals"] = len(arrivals)
    if cfg.priorities is not None:
        sizes["priorities"] = len(priorities)
    if len(set(sizes.values())) != 1:
        listed = ", ".join(f"workload.{name} has {count}" for name, count in sizes.items())
        raise ValueError(f"the fixed workload's lists must have equal lengths; {listed}")
    if not cfg.prompt_lens:
        raise ValueError("workload.prompt_lens must list at least one request; got []")
    for i, (prompt_len, output_len, arrival) in enumerate(
        zip(cfg.prompt_lens, cfg.output_lens, arrivals, strict=True)
    ):
        require_at_least(f"prompt_lens[{i}]", prompt_len, 1)
        require_at_least(f"output_lens[{i}]", output_len, 1)
        require_at_least(f"arrivals[{i}]", arrival, 0)


def build_fixed(cfg: FixedWorkloadConfig, tokenizer: PreTrainedTokenizerBase) -> list[RequestSpec]:
    """One request per index of `prompt_lens` / `output_lens` / `arrivals` / `priorities`."""
    check_fixed(cfg)
    n = len(cfg.prompt_lens)
    arrivals = [0.0] * n if cfg.arrivals is None else list(cfg.arrivals)
    priorities = [0] * n if cfg.priorities is None else list(cfg.priorities)
    prompts = exact_length_prompts(tokenizer, cfg.prompt_lens, np.random.default_rng(cfg.seed))
    return [
        RequestSpec(
            id=request_id(i),
            prompt_token_ids=ids,
            sampling=sampling_for(cfg, i, max_tokens=output_len, ignore_eos=True),
            arrival=float(arrival),
            prompt=text,
            priority=int(priority),
        )
        for i, ((ids, text), output_len, arrival, priority) in enumerate(
            zip(prompts, cfg.output_lens, arrivals, priorities, strict=True)
        )
    ]
