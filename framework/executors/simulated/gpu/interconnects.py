"""What joins a GPU to its tensor-parallel peers: each interconnect of a hardware spec names
the link it runs over (`links.yaml`), and is priced as an all-reduce either by its own fit to
a published table of that node (below the spec's fit marker) or, for a GPU with no such table,
in the *form* fitted on another GPU's table of the same kind of node, at this link's datasheet
bandwidth.

The form (`kernels.AllReduceFit`): latency + 2 (n - 1) / n x bytes / bus bandwidth, per worker
count n. Carried over, each worker count keeps the fitted latency, and its bus bandwidth keeps
the fitted share of its link's bandwidth (each way):

    bus_bandwidth[n] = fitted bus_bandwidth[n] x this link's bandwidth / the fitted link's

so an A100 in a DGX (NVLink 3, 300 GB/s each way) is priced at the share of NVLink 4 (450 GB/s)
that the H100 DGX table reaches, and a bridged pair of A100 PCIe cards at the share of the
same bridge (300 GB/s each way) that the H100 NVL pairs' table reaches.

A spec's `links:` section, one entry per interconnect:

    links:
      dgx: {link: nvlink3, form: h100-sxm, workers: [2, 4, 8]}   # priced in h100-sxm's dgx form
      nvlink_pair: {link: nvlink_bridge}                          # fitted below the marker
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from framework.executors.simulated.cost import ProfileError
from framework.executors.simulated.gpu.kernels import AllReduceFit
from framework.executors.simulated.links import LinkSpec, shipped_links


@dataclass(frozen=True)
class InterconnectSource:
    """Where one interconnect's all-reduce price comes from: the link it runs over and, when
    not fitted on this GPU, the spec whose fitted form it takes (and the worker counts it
    joins: a bridged pair joins 2, whatever the form's table measured)."""

    link: str  # a key of links.yaml
    form: str | None = None  # a shipped spec's name; None: fitted on this GPU's own table
    workers: tuple[int, ...] | None = None  # None: every worker count of the form

    @classmethod
    def from_dict(cls, data: Any, where: str) -> InterconnectSource:
        if isinstance(data, str):  # `dgx: nvlink`, the link alone
            data = {"link": data}
        if not isinstance(data, dict) or not isinstance(data.get("link"), str):
            raise ProfileError(f"{where}: a mapping with `link:` (a key of links.yaml)")
        known = shipped_links()
        if data["link"] not in known:
            raise ProfileError(
                f"{where}.link: {data['link']!r} is not in links.yaml ({', '.join(known)})"
            )
        form = data.get("form")
        if form is not None and not isinstance(form, str):
            raise ProfileError(f"{where}.form: a shipped spec's name")
        workers = data.get("workers")
        if workers is not None:
            ok = isinstance(workers, list) and workers
            if not ok or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in workers
            ):
                raise ProfileError(f"{where}.workers: a list of worker counts, each >= 2")
            workers = tuple(sorted(workers))
        return cls(data["link"], form, workers)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"link": self.link}
        if self.form is not None:
            out["form"] = self.form
        if self.workers is not None:
            out["workers"] = list(self.workers)
        return out

    @property
    def link_spec(self) -> LinkSpec:
        return shipped_links()[self.link]


def carried_form(fitted: AllReduceFit, fitted_link: LinkSpec, link: LinkSpec) -> AllReduceFit:
    """`fitted` (an all-reduce fitted over `fitted_link`) at `link`'s bandwidth: the same
    latency, and the same share of the link's bandwidth, at each worker count."""
    scale = link.bandwidth / fitted_link.bandwidth
    return AllReduceFit(
        dict(fitted.latency_s), {n: bw * scale for n, bw in fitted.bus_bandwidth.items()}
    )


def parse_links(data: Any, where: str) -> dict[str, InterconnectSource]:
    """A spec's `links:` section (absent: none)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: not a mapping of interconnects")
    return {str(k): InterconnectSource.from_dict(v, f"{where}.{k}") for k, v in data.items()}


def resolve_interconnects(
    data: dict[str, Any], where: str, load_spec: Any, seen: tuple[str, ...] = ()
) -> dict[str, dict[int, dict[str, float]]]:
    """A spec file's interconnects with every carried one worked out: its fitted ones as
    written, and one for each `links:` entry with a `form`, from that spec's fit of the
    interconnect of the same name. `load_spec(name)` reads another spec file, resolved."""
    fitted = dict(data.get("interconnects") or {})
    for name, source in parse_links(data.get("links"), f"{where}.links").items():
        if source.form is None:
            continue
        here = f"{where}.links.{name}.form"
        if name in fitted:
            raise ProfileError(
                f"{here}: interconnect {name} is fitted below the marker as well; keep one"
            )
        if source.form in seen:
            raise ProfileError(f"{here}: {source.form} takes its form back from this spec")
        other = load_spec(source.form, (*seen, str(data.get("id"))))
        theirs = parse_links(other.get("links"), f"{source.form}.links").get(name)
        fit_in = (other.get("interconnects") or {}).get(name)
        if theirs is None or fit_in is None:
            raise ProfileError(
                f"{here}: {source.form} has no fitted interconnect {name} with a link to scale"
            )
        form = AllReduceFit.from_dict(fit_in, f"{source.form}.interconnects.{name}")
        carried = carried_form(form, theirs.link_spec, source.link_spec)
        workers = source.workers or carried.workers
        missing = [n for n in workers if n not in carried.latency_s]
        if missing:
            raise ProfileError(
                f"{where}.links.{name}.workers: {source.form}'s {name} form has no fit for "
                f"{missing} workers (has {list(carried.workers)})"
            )
        fitted[name] = {
            n: {"latency_s": carried.latency_s[n], "bus_bandwidth": carried.bus_bandwidth[n]}
            for n in workers
        }
    return fitted
