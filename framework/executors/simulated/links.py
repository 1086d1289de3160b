"""The links a disaggregated cluster's KV transfers may take (`cluster.link`): each one's
bandwidth per GPU port and latency, from `links.yaml`, with the documents they come from."""

from __future__ import annotations

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


def shipped_links() -> dict[str, LinkSpec]:
    """Every link of `links.yaml`, by its name."""
    raw = yaml.safe_load(LINKS_FILE.read_text(encoding="utf-8"))
    return {
        key: LinkSpec(
            key,
            str(entry["name"]),
            float(entry["gbyte_s"]) * 1e9,
            float(entry["latency_us"]) / 1e6,
            tuple(entry.get("sources") or ()),
        )
        for key, entry in raw.items()
    }


def link_spec(name: str) -> LinkSpec:
    """The shipped link `name`; an unknown one is refused, naming those there are."""
    links = shipped_links()
    if name not in links:
        raise ValueError(f"cluster.link must be one of {', '.join(links)}; got {name!r}")
    return links[name]
