"""A disaggregated cluster's parts from the run's config: the replicas' roles, the decode
router (`router.decode`), the link (`cluster.link`, `cluster.link_gbps`,
`cluster.link_latency_us`) and what a token's KV weighs on it (`framework.cluster.handoffs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from framework.cluster.handoffs import Disaggregation, KVShape
from framework.cluster.link import Link
from framework.engine.loop import Engine
from framework.executors.simulated.links import link_spec
from framework.plugin_host.registry import registry
from framework.run.roles import cluster_roles


@dataclass(frozen=True)
class LinkSetting:
    """The link as the run uses it: bytes/s each way per GPU port, seconds of latency."""

    name: str
    bandwidth: float
    latency: float

    def describe(self) -> dict[str, Any]:
        return {
            "link": self.name,
            "link_gbyte_s": self.bandwidth / 1e9,
            "link_latency_us": self.latency * 1e6,
        }


def link_setting(cfg: DictConfig) -> LinkSetting:
    """`cluster.link`, with `link_gbps` (Gbit/s) and `link_latency_us` in its place if set."""
    c = cfg.cluster
    spec = link_spec(str(c.link))
    bandwidth = spec.bandwidth if c.link_gbps is None else float(c.link_gbps) * 1e9 / 8
    latency = spec.latency if c.link_latency_us is None else float(c.link_latency_us) / 1e6
    return LinkSetting(spec.id, bandwidth, latency)


def kv_shape(cfg: DictConfig, model: Any, dtype: torch.dtype) -> KVShape:
    """A token's KV on one GPU of a replica: layers x KV heads per GPU (Megatron's shard,
    as the simulated pool holds them) x head dim x dtype bytes x 2 (K and V)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    tp = int(cfg.executor.tensor_parallel)
    kv_heads = max(1, -(-(getattr(c, "num_key_value_heads", None) or c.num_attention_heads) // tp))
    itemsize = torch.empty((), dtype=dtype).element_size()
    layers = int(c.num_hidden_layers)
    return KVShape(2 * layers * kv_heads * head_dim * itemsize, layers, tp)


def decode_router(cfg: DictConfig) -> tuple[Any, str, str]:
    """The router of decode choices: `router.decode` with its defaults (and the run's router
    seed), or, unset or the same name, a second instance of the run's router."""
    reg = registry()
    own = OmegaConf.to_container(cfg.router, resolve=True)
    assert isinstance(own, dict)
    name = own.get("decode") or own["name"]
    if name not in reg.policies.get("router", {}):
        raise ValueError(
            f"router.decode={name}: no router policy of that name; router offers "
            f"{reg.choices('router')}"
        )
    options = own if name == own["name"] else {"name": name, "seed": own.get("seed", 0)}
    router = reg.build("router", OmegaConf.create(options))
    return router, str(name), reg.get("router", str(name)).provider.label


def build_handoffs(
    cfg: DictConfig, engines: list[Engine], model: Any, dtype: torch.dtype
) -> tuple[list[str] | None, Disaggregation | None]:
    """The replicas' roles (None: the plain cluster) and, with prefill replicas, what
    moves their requests to the decode replicas."""
    roles = cluster_roles(cfg.cluster)
    if roles is None or "prefill" not in roles:
        return roles, None
    router, name, provider = decode_router(cfg)
    link = link_setting(cfg)
    moves = Disaggregation(
        engines,
        roles,
        router,
        name,
        provider,
        Link(link.bandwidth, link.latency),
        kv_shape(cfg, model, dtype),
        layerwise=bool(cfg.cluster.layerwise),
    )
    return roles, moves
