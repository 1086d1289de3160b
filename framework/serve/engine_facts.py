"""What the HTTP side needs to know of the engine, taken once when it is built: enough to
check a request and describe the server without touching the engine itself, which may run
in another process (`server.engine=process`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from framework.engine.executor import describe
from framework.engine.loop import Engine
from framework.run.simulation import is_simulated


@dataclass(frozen=True)
class EngineFacts:
    max_num_seqs: int
    max_model_len: int
    room: int  # the longest prompt + output the engine could ever serve
    forks: bool  # whether its KV blocks can be shared (beam search needs it)
    scores: bool  # whether its executor gives log-probabilities (a simulated one does not)
    eos_token_id: int | None
    said: dict[str, Any]  # /v1/models' `nanoserve` entry: executor, policies, clock

    @classmethod
    def of(cls, cfg: DictConfig, engine: Engine, eos_token_id: int | None) -> EngineFacts:
        limits, pool = engine.limits, engine.pool
        room = min(limits.max_model_len, pool.num_blocks * pool.block_size)
        if not engine.cuts_prefills:  # a prompt must fit one step
            room = min(room, limits.max_num_batched_tokens)
        return cls(
            max_num_seqs=limits.max_num_seqs,
            max_model_len=limits.max_model_len,
            room=room,
            forks=bool(pool.forks),
            scores=bool(getattr(engine.executor, "scores", False)),
            eos_token_id=eos_token_id,
            said=what_serves(cfg, engine),
        )


def what_serves(cfg: DictConfig, engine: Engine) -> dict[str, Any]:
    """/v1/models' `nanoserve` entry: the executor (a simulation's cost model and profile),
    the policies and the clock."""
    out: dict[str, Any] = dict(describe(engine.executor))
    out["clock"] = engine.clock.name
    out["pace"] = str(cfg.executor.pace) if is_simulated(cfg) else "real"
    out.update({group: str(cfg[group].name) for group in engine.p.names})
    return out
