"""A cluster's replica roles and link settings (`cluster.roles`, `cluster.prefill`,
`cluster.decode`, `cluster.link`, ...), checked before any model loads: one line naming the
field for each mistake."""

from __future__ import annotations

from typing import Any

from framework.executors.simulated.links import link_spec

ROLES = ("prefill", "decode", "mixed")


def cluster_roles(c: Any) -> list[str] | None:
    """Each replica's role from `cluster.roles`, or from the counts `cluster.prefill` and
    `cluster.decode` (those first, the rest mixed); None when neither is set."""
    counts = [c.get("prefill"), c.get("decode")]
    if c.get("roles") is not None:
        if any(n is not None for n in counts):
            raise ValueError(
                "set cluster.roles or the counts cluster.prefill and cluster.decode, not both"
            )
        return [str(r) for r in c.roles]
    if all(n is None for n in counts):
        return None
    p, d = (0 if n is None else n for n in counts)
    for key, n in (("prefill", p), ("decode", d)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"cluster.{key} must be an integer >= 0; got {n}")
    if p + d > c.replicas:
        raise ValueError(
            f"cluster.prefill + cluster.decode = {p + d} exceeds cluster.replicas = "
            f"{c.replicas}: set cluster.replicas={p + d} or more (the rest are mixed)"
        )
    return ["prefill"] * p + ["decode"] * d + ["mixed"] * (c.replicas - p - d)


def check_disaggregation(cfg: Any) -> None:
    """Replica roles and the link: one line naming the field."""
    c = cfg.cluster
    roles = cluster_roles(c)
    if roles is not None:
        if cfg.executor.name != "simulated" or c.backend != "local":
            raise ValueError(
                "cluster.roles (prefill/decode disaggregation) runs on executor=simulated "
                "with cluster.backend=local"
            )
        unknown = [r for r in roles if r not in ROLES]
        if unknown:
            raise ValueError(
                f"cluster.roles: unknown role {unknown[0]!r}; each is prefill, decode or mixed"
            )
        if len(roles) != c.replicas:
            raise ValueError(
                f"cluster.roles has {len(roles)} roles for cluster.replicas = {c.replicas}: "
                "one a replica"
            )
        if not any(r in ("prefill", "mixed") for r in roles):
            raise ValueError(
                "cluster.roles leave no replica to prefill requests (prefill or mixed)"
            )
        if not any(r in ("decode", "mixed") for r in roles):
            raise ValueError("cluster.roles leave no replica to decode requests (decode or mixed)")
    link_spec(str(c.link))  # an unknown link is refused by name
    if c.link_gbps is not None and not c.link_gbps > 0:
        raise ValueError(f"cluster.link_gbps must be > 0 (Gbit/s each way); got {c.link_gbps}")
    if c.link_latency_us is not None and c.link_latency_us < 0:
        raise ValueError(f"cluster.link_latency_us must be >= 0; got {c.link_latency_us}")
    if roles is None or "prefill" not in roles:
        unused = [
            key
            for key, value in (
                ("cluster.link_gbps", c.link_gbps),
                ("cluster.link_latency_us", c.link_latency_us),
                ("cluster.layerwise", c.layerwise or None),
                ("router.decode", cfg.router.get("decode")),
            )
            if value is not None
        ]
        if unused:
            raise ValueError(
                f"{unused[0]} applies to a cluster with prefill replicas (cluster.roles)"
            )
