"""The links between GPUs, from `links.yaml`: each one's bandwidth per GPU port and latency,
with the documents they come from. A disaggregated cluster's KV transfers take one
(`cluster.link`); a hardware spec's tensor-parallel interconnects each run over one
(`gpu.interconnects`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

LINKS_FILE = Path(__file__).resolve().parent / "links.yaml"


@dataclass(frozen=True)
class LinkSpec:
    """One link: `bandwidth` in bytes/s each way per GPU port, `latency` in seconds."""

    id: str
    name: str
    bandwidth: float
    latency: float
    sources: tuple[str, ...]
    host: bool = False  # a GPU's link to its host's memory (a swap's copies), not between GPUs


def shipped_links() -> dict[str, LinkSpec]:
    """Every link between GPUs of `links.yaml`, by its name."""
    return {k: v for k, v in _read_links().items() if not v.host}


def host_links() -> dict[str, LinkSpec]:
    """Every host link of `links.yaml` (`host: true`), by its name."""
    return {k: v for k, v in _read_links().items() if v.host}


@functools.cache
def _read_links() -> dict[str, LinkSpec]:
    """The file, parsed once: every hardware spec that names a link reads it."""
    raw = yaml.safe_load(LINKS_FILE.read_text(encoding="utf-8"))
    return {
        key: LinkSpec(
            key,
            str(entry["name"]),
            float(entry["gbyte_s"]) * 1e9,
            float(entry["latency_us"]) / 1e6,
            tuple(entry.get("sources") or ()),
            bool(entry.get("host", False)),
        )
        for key, entry in raw.items()
    }


def link_spec(name: str) -> LinkSpec:
    """The shipped link `name`; an unknown one is refused, naming those there are."""
    links = shipped_links()
    if name not in links:
        raise ValueError(f"cluster.link must be one of {', '.join(links)}; got {name!r}")
    return links[name]
