"""The composed config's checks: each rejects a bad value before any model is loaded, naming
the field and what it accepts (a user's mistake is one line and exit 2, never a traceback
from deep inside a run)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.api.policy import SWAP
from framework.api.preempting import CHEAPER
from framework.cluster.outages import parse_outages
from framework.core.request import NEUTRAL_PENALTIES
from framework.executors.decode_graphs import graphs_setting
from framework.executors.kernel_choice import FLEX_KEYS, setting
from framework.executors.linear_choice import small_setting
from framework.executors.model_loader import TinySpec
from framework.run.config import (
    ClusterConfig,
    EngineConfig,
    ExecutorConfig,
    MlflowConfig,
    ModelConfig,
    ResultsConfig,
    RunConfig,
)
from framework.run.roles import check_disaggregation
from framework.run.server_config import ServerConfig

KV_LAYOUTS = ("paged", "contiguous")


def check_engine(e: Any) -> None:
    """Reject bad engine limits before any model is loaded, naming the field."""
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if e[name] < 1:
            raise ValueError(f"engine.{name} must be >= 1, got {e[name]}")
    if e.num_blocks is not None and e.num_blocks < 1:
        raise ValueError(
            f"engine.num_blocks must be >= 1 (or null: size from kv_memory_mb), got {e.num_blocks}"
        )
    if e.num_blocks is None and e.kv_memory_mb <= 0:
        raise ValueError(f"engine.kv_memory_mb must be > 0, got {e.kv_memory_mb}")
    kernels = (
        "packed_linears",
        "paged_kernel",
        "argmax_kernel",
        "layer_glue",
        *FLEX_KEYS,
    )
    for name in kernels:
        setting(e[name], name)  # auto, true or false
    small_setting(e.small_linear)  # auto, true, false or a row count
    graphs_setting(e.cuda_graphs)
    if e.host_kv_memory_mb < 0:
        raise ValueError(
            f"engine.host_kv_memory_mb must be >= 0 (0: no host KV tier), got {e.host_kv_memory_mb}"
        )
    if e.kv_layout not in KV_LAYOUTS:
        raise ValueError(
            f"engine.kv_layout must be one of {', '.join(KV_LAYOUTS)}; got {e.kv_layout!r}"
        )
    if e.max_num_batched_tokens < e.max_num_seqs:
        raise ValueError(
            f"engine.max_num_batched_tokens ({e.max_num_batched_tokens}) must be >= "
            f"engine.max_num_seqs ({e.max_num_seqs}): every row costs at least one token"
        )


# ---- whole-run checks: everything that can be known before the model loads ----------------

_SCHEMAS: tuple[tuple[str, type], ...] = (
    ("", RunConfig),
    ("engine", EngineConfig),
    ("model", ModelConfig),
    ("model.tiny", TinySpec),
    ("executor", ExecutorConfig),
    ("cluster", ClusterConfig),
    ("results", ResultsConfig),
    ("mlflow", MlflowConfig),
    ("server", ServerConfig),
)


def _fields(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def check_unknown_keys(cfg: Any) -> None:
    """A `+engine.x=...` (or `+x=...`) override slips past Hydra's struct checks; reject
    any key the schema does not have, listing the ones it does. (Policy and workload
    groups are checked by their own dataclasses when they are built.)"""
    for path, schema in _SCHEMAS:
        node = OmegaConf.select(cfg, path) if path else cfg
        if not isinstance(node, DictConfig):
            continue
        allowed = _fields(schema)
        unknown = [str(k) for k in node if k not in allowed]
        if unknown:
            where = f"{path}.{unknown[0]}" if path else str(unknown[0])
            group = f"the {path} group" if path else "the top level"
            raise ValueError(
                f"{where} is not a setting of {group}; its settings are: {', '.join(allowed)}"
            )


def check_model(m: Any) -> None:
    """A model folder that is missing or not a causal LM, named before anything loads
    (the loader checks again, for callers that skip this)."""
    sources = ("smollm2", "tiny", "hf")
    if m.source not in sources:
        raise ValueError(f"model.source must be one of {', '.join(sources)}; got {m.source!r}")
    if m.max_model_len is not None and m.max_model_len < 1:
        raise ValueError(
            f"model.max_model_len must be >= 1 (or null: the model's own), got {m.max_model_len}"
        )
    if m.source != "hf":
        if m.get("random_weights"):
            raise ValueError(
                f"model.random_weights applies to model=hf (a folder's config); this run "
                f"uses model={m.source}"
            )
        return
    if not m.path:
        raise ValueError("model=hf needs model.path=DIR (a local Hugging Face model folder)")
    folder = Path(m.path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"model.path={m.path}: no such directory")
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"model.path={m.path}: no config.json, not a Hugging Face model folder")
    try:
        archs = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"model.path={m.path}: config.json is not readable JSON ({e})") from e
    if not any(str(a).endswith("ForCausalLM") for a in archs):
        raise ValueError(
            f"model.path={m.path} is not a causal LM (architectures: {archs}); "
            f"nanoserve serves *ForCausalLM models"
        )


def overlap_setting(value: Any) -> bool | None:
    """`executor.overlap` as True / False, or None for auto (the profile's device)."""
    text = str(value).strip().lower()
    if text in ("auto", "true", "false"):
        return None if text == "auto" else text == "true"
    raise ValueError(
        "executor.overlap must be auto (a GPU profile: true, a CPU one: false), true or "
        f"false; got {value!r}"
    )


def check_executor(x: Any) -> None:
    """The executor's settings, named; the simulator's own ones are refused for the real
    executor rather than silently ignored."""
    if x.name not in ("model", "simulated"):
        raise ValueError(f"executor must be model or simulated; got {x.name!r}")
    if x.host_time not in ("measured", "model"):
        raise ValueError(f"executor.host_time must be measured or model; got {x.host_time!r}")
    if x.mean_output_tokens < 1:
        raise ValueError(f"executor.mean_output_tokens must be >= 1; got {x.mean_output_tokens}")
    if not x.speed > 0:
        raise ValueError(f"executor.speed must be > 0 (1: the profile's machine); got {x.speed}")
    if x.compute_speed is not None and not x.compute_speed > 0:
        raise ValueError(
            f"executor.compute_speed must be > 0, or null for executor.speed; got {x.compute_speed}"
        )
    overlap = overlap_setting(x.overlap)
    if x.pace not in ("none", "wall"):
        raise ValueError(
            f"executor.pace must be none or wall (executor=simulated under serve.py); "
            f"got {x.pace!r}"
        )
    if x.tensor_parallel not in (1, 2, 4, 8):
        raise ValueError(
            f"executor.tensor_parallel must be 1, 2, 4 or 8; got {x.tensor_parallel!r}"
        )
    if x.software != "ideal":
        from framework.executors.simulated.software import SoftwareProfile

        SoftwareProfile.load(str(x.software))  # a bad name or field: one line, before any run
    if x.name == "model":
        if x.software != "ideal" or x.api_server:
            raise ValueError(
                "executor.software and executor.api_server apply to executor=simulated (this "
                "run's engine is nanoserve itself)"
            )
        if x.tensor_parallel != 1:
            raise ValueError(
                "executor.tensor_parallel applies to executor=simulated with an analytic GPU "
                "profile (this run uses the model, on one device)"
            )
        if overlap is not None:
            raise ValueError(
                "executor.overlap applies to executor=simulated (this run uses the model)"
            )
        for key in ("profile", "replay", "compute_speed"):
            if x[key] is not None:
                raise ValueError(
                    f"executor.{key} applies to executor=simulated (this run uses the model)"
                )
        if x.speed != 1:
            raise ValueError(
                "executor.speed applies to executor=simulated (this run uses the model)"
            )
        if x.pace != "none":
            raise ValueError(
                "executor.pace=wall applies to executor=simulated (the model's steps take "
                "their own time)"
            )


def shaping(cfg: Any) -> str | None:
    """The first workload field that changes the model's logits before the draw (a penalty,
    min_tokens), else None."""
    for name, value in {**NEUTRAL_PENALTIES, "min_tokens": 0}.items():
        if OmegaConf.select(cfg, f"workload.{name}", default=value) != value:
            return name
    return None


def check_beams(cfg: Any) -> None:
    """Beam search (`workload.beam_width` > 1) where it can run: one line naming what
    stands in its way."""
    width = OmegaConf.select(cfg, "workload.beam_width", default=1)
    if not isinstance(width, int) or width <= 1:
        return
    why = None
    if cfg.executor.name == "simulated":
        why = "a simulated executor has no logits to rank beams by; use executor=model"
    elif cfg.engine.kv_layout != "paged":
        why = "beams share blocks, which extents cannot: engine.kv_layout=paged"
    elif cfg.cluster.backend == "ray" or cfg.cluster.get("faults"):
        why = "a request's beams must stay on one replica: no cluster.backend=ray or faults"
    elif OmegaConf.select(cfg, "workload.temperature", default=0.0):
        why = "beam search is greedy: workload.temperature=0"
    elif shaping(cfg):
        why = f"beam search ranks the model's own log-probabilities: no workload.{shaping(cfg)}"
    elif (n := OmegaConf.select(cfg, "workload.n", default=1)) > width:
        why = f"workload.n={n} beams returned must be <= beam_width"
    elif width > cfg.engine.max_num_seqs:
        why = f"its beams cannot run side by side in engine.max_num_seqs={cfg.engine.max_num_seqs}"
    if why is not None:
        raise ValueError(f"workload.beam_width={width}: {why}")


def check_run(cfg: Any) -> None:
    """The top-level settings and the engine limits, before any model is loaded."""
    check_unknown_keys(cfg)
    check_engine(cfg.engine)
    check_model(cfg.model)
    check_executor(cfg.executor)
    check_cluster(cfg)
    n = OmegaConf.select(cfg, "workload.n", default=1)
    if isinstance(n, int) and n > cfg.engine.max_num_seqs:
        raise ValueError(
            f"workload.n={n} samples of a request cannot run side by side in "
            f"engine.max_num_seqs={cfg.engine.max_num_seqs} rows; raise it, or lower n"
        )
    check_beams(cfg)
    if (field := shaping(cfg)) and cfg.executor.name == "simulated":
        asked = OmegaConf.select(cfg, f"workload.{field}")
        raise ValueError(
            f"workload.{field}={asked}: a simulated executor has no logits to change; use "
            "executor=model"
        )
    for name in ("logprobs", "prompt_logprobs"):
        asked = OmegaConf.select(cfg, f"workload.{name}", default=None)
        if asked is not None and cfg.executor.name == "simulated":
            raise ValueError(
                f"workload.{name}={asked}: a simulated executor has no logits to score; "
                "use executor=model, or leave it null"
            )
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1 (or null: torch's default), got {cfg.threads}")
    if cfg.print_limit is not None and cfg.print_limit < 0:
        raise ValueError(f"print_limit must be >= 0 (or null: every answer), got {cfg.print_limit}")
    if cfg.mlflow.max_step_points < 2:
        raise ValueError(
            f"mlflow.max_step_points must be >= 2 (points per per-step series), "
            f"got {cfg.mlflow.max_step_points}"
        )
    cap = cfg.mlflow.max_artifact_mb
    if cap is not None and cap < 0:
        raise ValueError(f"mlflow.max_artifact_mb must be >= 0 (or null: every file), got {cap}")
    if str(cfg.results.compress).lower() not in ("auto", "true", "false"):
        raise ValueError(
            f"results.compress must be auto, true or false, got {cfg.results.compress!r}"
        )


def check_cluster(cfg: Any) -> None:
    """A cluster's size and where it runs: one line naming the field."""
    c = cfg.cluster
    if isinstance(c.replicas, bool) or not isinstance(c.replicas, int) or c.replicas < 1:
        raise ValueError(f"cluster.replicas must be an integer >= 1; got {c.replicas}")
    if c.backend not in ("local", "ray"):
        raise ValueError(
            f"cluster.backend must be local (every replica in this process) or ray (each "
            f"replica a Ray actor); got {c.backend!r}"
        )
    simulated = cfg.executor.name == "simulated"
    if c.backend == "ray" and simulated:
        raise ValueError(
            "cluster.backend=ray runs replicas of the real executor (executor=model); a "
            "simulated cluster runs in one process on one virtual clock (cluster.backend=local)"
        )
    restarts = c.get("restart_replicas", 0)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ValueError(f"cluster.restart_replicas must be an integer >= 0; got {restarts!r}")
    if restarts and c.backend != "ray":
        raise ValueError(
            "cluster.restart_replicas applies to cluster.backend=ray (a simulated replica "
            "comes back at its fault's up_at_s)"
        )
    faults = c.get("faults")
    if faults:
        if c.replicas < 2:
            raise ValueError("cluster.faults need cluster.replicas >= 2: a replica must be left")
        raw = OmegaConf.to_container(faults) if OmegaConf.is_config(faults) else faults
        outages = parse_outages(raw, c.replicas)
        if c.backend == "ray" and any(o.up_at_s is not None for o in outages):
            raise ValueError(
                "cluster.faults on cluster.backend=ray kill a replica's actor for good: leave "
                "up_at_s unset there (a killed replica is not restarted)"
            )
        if c.roles is not None or c.prefill is not None or c.decode is not None:
            raise ValueError(
                "cluster.faults apply to replicas of one role: leave cluster.roles, prefill "
                "and decode unset"
            )
    check_disaggregation(cfg)


def check_window(cfg: Any) -> None:
    """A negative `window` is an error whichever output policy is chosen (output=deferred
    reports it in its own words when it is built, before this runs)."""
    if cfg.window < 0:
        raise ValueError(
            f"window must be >= 0 (steps of sampled tokens held on the device by "
            f"output=deferred; 0: none), got {cfg.window}"
        )


def check_host_tier(cfg: DictConfig, policies: Any) -> None:
    """A preemption that swaps needs a host tier, and the host tier a pool that caches no
    prefixes (a prefix cache's blocks outlive their request: what a readmission shares and
    what it copies back would have to be told apart, which is not built)."""
    mode = cfg.preemption.get("mode")
    host = float(cfg.engine.host_kv_memory_mb)
    if mode in (SWAP, CHEAPER) and host <= 0:
        raise ValueError(
            f"preemption.mode={mode} swaps KV to a host tier: set engine.host_kv_memory_mb > 0"
        )
    if host > 0 and getattr(policies.allocator, "caches_prefixes", False):
        raise ValueError(
            "engine.host_kv_memory_mb > 0 takes an allocator that caches no prefixes; got "
            f"allocator={cfg.allocator.name}"
        )
