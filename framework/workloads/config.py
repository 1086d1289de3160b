"""Structured configs for workloads: one dataclass per `kind`, registered as Hydra schemas.

Each YAML in `conf/workload/` starts with `defaults: [<kind>_schema, _self_]`, so Hydra checks
field names and types at compose time: a typo fails before any model is loaded. `as_config`
applies the same schema to configs that did not come through Hydra (tests, notebooks, plain
dicts), so that builders only ever see a typed, complete dataclass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, ValidationError


@dataclass
class WorkloadConfig:
    """Fields every workload shares: what it is and how its requests sample.

    Request i (in the order the workload defines them) samples with seed `seed + i`, so a
    run is reproducible and no two requests share a random stream. `n` > 1 asks for that
    many samples of each request (parallel sampling), run over one copy of its prompt's KV.
    `logprobs` / `prompt_logprobs` (k >= 0) write each output / prompt token's
    log-probability and its k most likely alternatives into outputs.jsonl (the model
    executor computes them; a simulator has no logits).
    """

    kind: str = MISSING
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Beam search: `beam_width` > 1 beams a request (greedy; outputs.jsonl has a line a
    # beam, the best first), hypotheses ranked by log-probability / length ** length_penalty.
    beam_width: int = 1
    length_penalty: float = 1.0
    # Penalties on tokens a sequence already has (OpenAI's and vLLM's; neutral 0, 0, 1), and
    # no stop token among the first `min_tokens` output tokens (at most a request's
    # max_tokens): they change the model's logits, so a simulator refuses them.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0


@dataclass
class ChatWorkloadConfig(WorkloadConfig):
    """The built-in chat prompts (`data/chat_prompts.jsonl`), through the chat template."""

    kind: str = "chat"
    max_tokens: int = 48
    limit: int | None = None  # first N prompts; None: all of them


@dataclass
class FixedWorkloadConfig(WorkloadConfig):
    """Requests of exact, listed prompt and output lengths (EOS ignored)."""

    kind: str = "fixed"
    prompt_lens: list[int] = MISSING
    output_lens: list[int] = MISSING
    arrivals: list[float] | None = None  # seconds; None: everyone at t=0
    priorities: list[int] | None = None  # lower is more urgent; None: every request 0


@dataclass
class JsonlWorkloadConfig(WorkloadConfig):
    """One request per line of a JSON Lines file (see `jsonl.py` for the line format)."""

    kind: str = "jsonl"
    path: str = MISSING
    chat: bool = True  # default for lines without a `chat` key


@dataclass
class SyntheticWorkloadConfig(WorkloadConfig):
    """Random lengths and arrivals, reproducible from `seed`.

    Lengths (`prompt_len_*`, `output_len_*` alike), in tokens:
      fixed:     every request gets `mean`.
      uniform:   integers uniform on [min, max], both inclusive; `mean` is not used.
      lognormal: lognormal with arithmetic mean `mean` and coefficient of variation `cv`
                 (std / mean), rounded and clipped to [min, max] (clipping moves the mean a
                 little when the tails are cut).
    Arrivals (the first request always arrives at t=0):
      poisson: exponential gaps with mean 1 / rate.
      gamma:   gamma gaps with mean 1 / rate and coefficient of variation `cv` (cv > 1 is
               burstier than Poisson, cv < 1 more regular, cv = 1 is Poisson).
      burst:   everyone at t=0; `rate` is not used.
    """

    kind: str = "synthetic"
    num_requests: int = 32
    prompt_len_dist: str = "lognormal"
    prompt_len_mean: int = 128
    prompt_len_min: int = 8
    prompt_len_max: int = 512
    prompt_len_cv: float = 1.0
    output_len_dist: str = "lognormal"
    output_len_mean: int = 64
    output_len_min: int = 4
    output_len_max: int = 256
    output_len_cv: float = 1.0
    arrival: str = "poisson"
    rate: float = 4.0  # requests per second
    cv: float = 2.0  # of the gamma inter-arrival gaps


@dataclass
class TraceWorkloadConfig(WorkloadConfig):
    """Replay of a production trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens), or of a
    CSV of lengths alone (num_prefill_tokens, num_decode_tokens) under generated arrivals.

    `time_scale` multiplies the recorded gaps: 0.5 replays twice as fast (double the load),
    2.0 half as fast, 0 sends the whole slice at t=0. Lengths are clamped to the caps and to
    at least 1 token (an engine cannot run an empty prompt or generate nothing).

    `arrival`: `recorded` replays the TIMESTAMP column; `poisson`, `gamma` and `burst` keep
    the recorded lengths and draw the arrivals as the synthetic workload does, at `rate`
    requests/s (gamma: gaps with coefficient of variation `cv`; burst: everyone at t=0),
    seeded by `seed`. Which columns hold the lengths is recognised from the header (either
    layout above), or named by `prompt_column` and `output_column` together.
    """

    kind: str = "trace"
    path: str = MISSING
    start: int = 0  # first data row (0-based, header excluded)
    limit: int | None = 100  # rows from `start`; None: to the end of the file
    time_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    arrival: str = "recorded"  # recorded | poisson | gamma | burst
    rate: float | None = None  # requests per second (poisson, gamma); None with recorded
    cv: float = 2.0  # of the gamma inter-arrival gaps
    prompt_column: str | None = None  # None: recognised from the header
    output_column: str | None = None


@dataclass
class MooncakeWorkloadConfig(WorkloadConfig):
    """Replay of a Mooncake trace (JSON Lines: timestamp in ms, input_length, output_length,
    hash_ids), with the prefix sharing its hash ids record.

    Hash id k of a line names the k-th `block_tokens`-token block of its prompt, so requests
    whose lists start alike share that prefix; each id stands for a fixed block of seeded token
    ids (see `mooncake.py`). `start`, `limit`, `time_scale` and the caps are as for `trace`.
    """

    kind: str = "mooncake"
    path: str = MISSING
    start: int = 0  # first line (0-based, blank lines not counted)
    limit: int | None = 100  # lines from `start`; None: to the end of the file
    time_scale: float = 1.0
    block_tokens: int = 512  # tokens per hash id (the published traces use 512)
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None


@dataclass
class SharedPrefixWorkloadConfig(WorkloadConfig):
    """N system prompts x M questions: what prefix caching is for.

    Request prompts are a prefix's ids followed by a question's ids, so the requests of one
    prefix share exactly their first `prefix_tokens` ids. Prefixes and questions are windows
    of the corpus at distinct seeded offsets. `order`: `interleaved` is a seeded shuffle of all
    N*M requests (a cache must hold every prefix at once), `grouped` sends each prefix's
    questions back to back (the easy case). `rate`: Poisson arrivals in requests/s in that
    order, the first at t=0; None sends everyone at t=0.
    """

    kind: str = "shared_prefix"
    num_prefixes: int = 4
    questions_per_prefix: int = 8
    prefix_tokens: int = 256
    question_tokens: int = 32
    max_tokens: int = 32
    ignore_eos: bool = True
    order: str = "interleaved"
    rate: float | None = None


@dataclass
class MultiturnWorkloadConfig(WorkloadConfig):
    """C conversations of T turns, each turn's prompt extending the previous turn's whole prompt.

    Turn 1 is system + question_1; turn k is turn k-1's prompt + answer_{k-1} + question_k.
    The workload is built before the run, so answer_{k-1} is a seeded corpus window of
    `answer_tokens` tokens standing in for the model's answer, not the answer itself.
    Conversations start at Poisson times (`rate`, starts/s, the first at t=0; None: all at 0)
    and turn k arrives `(k-1) * think_time_s` after its conversation starts (open loop: it does
    not wait for turn k-1 to finish).
    """

    kind: str = "multiturn"
    conversations: int = 4
    turns: int = 4
    system_tokens: int = 64
    question_tokens: int = 32
    answer_tokens: int = 32
    max_tokens: int = 32
    ignore_eos: bool = True
    rate: float | None = None  # conversation starts per second
    think_time_s: float = 1.0


SCHEMAS: dict[str, type[WorkloadConfig]] = {
    "chat": ChatWorkloadConfig,
    "fixed": FixedWorkloadConfig,
    "jsonl": JsonlWorkloadConfig,
    "mooncake": MooncakeWorkloadConfig,
    "multiturn": MultiturnWorkloadConfig,
    "shared_prefix": SharedPrefixWorkloadConfig,
    "synthetic": SyntheticWorkloadConfig,
    "trace": TraceWorkloadConfig,
}


def register_workload_configs(cs: ConfigStore) -> None:
    """Store each kind's dataclass as `workload/<kind>_schema`, what the YAMLs build on."""
    for kind, schema in SCHEMAS.items():
        cs.store(group="workload", name=f"{kind}_schema", node=schema)


def as_config(cfg: Any) -> WorkloadConfig:
    """Turn a DictConfig, dict or dataclass into the typed dataclass of its `kind`.

    Going through the schema again (even for Hydra-composed configs) means a config built by
    hand gets the same type checks as one from YAML, and every error names `workload.<field>`.
    """
    if isinstance(cfg, WorkloadConfig):
        kind = cfg.kind
    elif isinstance(cfg, dict | DictConfig):
        kind = OmegaConf.select(OmegaConf.create(cfg), "kind")  # None when absent or ???
    else:
        raise TypeError(f"workload config must be a DictConfig, dict or dataclass, got {cfg!r}")
    if kind not in SCHEMAS:
        raise ValueError(f"workload.kind must be one of {', '.join(SCHEMAS)}; got {kind!r}")
    schema = SCHEMAS[kind]
    fields = [f.name for f in dataclasses.fields(schema)]
    # Checked by hand: a Hydra `+workload.x=...` override slips past OmegaConf's merge, which
    # would then set `x` as a stray attribute instead of failing.
    given = [f.name for f in dataclasses.fields(cfg)] if isinstance(cfg, WorkloadConfig) else cfg
    unknown = [k for k in given if k not in fields]
    if unknown:
        raise ValueError(
            f"workload.{unknown[0]} is not a field of workload kind {kind!r}; "
            f"its fields are: {', '.join(fields)}"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        typed = OmegaConf.to_object(merged)
    except MissingMandatoryValue as e:
        raise ValueError(
            f"workload.{e.full_key} is required for workload kind {kind!r}; "
            f"set it, e.g. on the command line: workload.{e.full_key}=..."
        ) from e
    except ValidationError as e:
        first_line = str(e).splitlines()[0]
        raise ValueError(f"workload.{e.full_key}: {first_line}") from e
    assert isinstance(typed, WorkloadConfig)
    return typed
