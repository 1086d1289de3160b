"""A GPU's hardware spec: its datasheet peaks, its fitted kernel families, its attention
efficiencies and its interconnects' all-reduce fits, read from a YAML file
(`framework/executors/simulated/hardware/*.yaml`, docs/simulator-analytic.md).

A spec file's interconnects are fitted on a published table of that node (below its fit
marker) or carried from another spec's fit at the datasheet bandwidth of the link it names
(`links:`, `gpu.interconnects`); `load_hardware_spec` works the carried ones out, so the dict
it returns, and every profile file written from it, holds plain numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.executors.simulated.cost import HostCost, ProfileError
from framework.executors.simulated.gpu.interconnects import (
    InterconnectSource,
    parse_links,
    resolve_interconnects,
)
from framework.executors.simulated.gpu.kernels import AllReduceFit, AttentionFit, KernelFits, number
from framework.executors.simulated.gpu.shard import Device

HARDWARE_DIR = Path(__file__).resolve().parents[1] / "hardware"

# Bytes a weight or a KV element takes in each dtype. `tfloat32` stores fp32 and multiplies
# on the TF32 tensor cores (PyTorch's `allow_tf32`); plain `float32` uses the CUDA cores.
DTYPE_BYTES = {"float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2}


def section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ProfileError(f"{where}.{key}: missing or not a mapping")
    return value


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator: its datasheet peaks, its fitted kernel families, the attention
    efficiencies taken from published kernels, and the all-reduce fit of each interconnect
    it is sold in. The peaks are dense (no 2:4 sparsity: a served model's weights are not
    sparse). Each spec file says where every number comes from."""

    id: str  # the spec file's stem, e.g. h100-sxm
    name: str  # the GPU as a person names it
    memory_bandwidth: float  # bytes/s, datasheet peak
    peak_flops: dict[str, float]  # FLOP/s per dtype, dense
    sms: int  # streaming multiprocessors: how many GEMM tiles run at once
    kernels: KernelFits
    attention: AttentionFit
    step_overhead_s: float  # per step: graph launch, host-device sync
    sample_overhead_s: float  # per step that samples
    host: HostCost  # the engine's own host work (scheduler, bookkeeping)
    interconnects: dict[str, AllReduceFit] = field(default_factory=dict)
    # What each interconnect runs over (a link of links.yaml) and whose fit it carries.
    links: dict[str, InterconnectSource] = field(default_factory=dict)
    # The interconnect a tensor-parallel run takes when `executor.interconnect` is unset: the
    # node the GPU is sold in (an SXM part's NVSwitch node, a PCIe card's bridged pair).
    default_interconnect: str | None = None
    memory_capacity: float | None = None  # bytes; informational
    # The GPU's link to its host's memory (a host link of links.yaml): what a swap of KV
    # blocks to the host tier takes (`engine.host_kv_memory_mb`). None: not stated.
    host_link: str | None = None
    sources: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "hardware") -> HardwareSpec:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: not a mapping")
        for key in ("id", "name"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ProfileError(f"{where}.{key}: missing or not a string")
        peaks_in = section(data, "peak_flops", where)
        peaks = {str(k): number(peaks_in, k, f"{where}.peak_flops") for k in peaks_in}
        overhead = section(data, "overhead", where)
        sampling = data.get("sampling") or {}
        host = data.get("host") or {}
        sms = data.get("sms")
        if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
            raise ProfileError(f"{where}.sms: the GPU's streaming multiprocessors, an integer >= 1")
        links_in = data.get("interconnects") or {}
        if not isinstance(links_in, dict):
            raise ProfileError(f"{where}.interconnects: not a mapping")
        capacity = data.get("memory_capacity")
        interconnects = {
            str(k): AllReduceFit.from_dict(v, f"{where}.interconnects.{k}")
            for k, v in links_in.items()
        }
        default = data.get("default_interconnect")
        if default is not None and default not in interconnects:
            have = ", ".join(sorted(interconnects)) or "none"
            raise ProfileError(
                f"{where}.default_interconnect: {default!r} is not one of its interconnects "
                f"({have})"
            )

        def optional(section: dict[str, Any], key: str, name: str) -> float:
            if key not in section:
                return 0.0
            return number(section, key, f"{where}.{name}", positive=False)

        return cls(
            id=data["id"],
            name=data["name"],
            memory_bandwidth=number(data, "memory_bandwidth", where),
            peak_flops=peaks,
            sms=sms,
            kernels=KernelFits.from_dict(data.get("kernels"), f"{where}.kernels"),
            attention=AttentionFit.from_dict(data.get("attention"), f"{where}.attention"),
            step_overhead_s=number(overhead, "per_step_s", f"{where}.overhead", positive=False),
            sample_overhead_s=optional(sampling, "per_step_s", "sampling"),
            host=HostCost(
                per_step_s=optional(host, "per_step_s", "host"),
                per_row_s=optional(host, "per_row_s", "host"),
            ),
            interconnects=interconnects,
            links=parse_links(data.get("links"), f"{where}.links"),
            default_interconnect=default,
            memory_capacity=(None if capacity is None else number(data, "memory_capacity", where)),
            host_link=None if data.get("host_link") is None else str(data["host_link"]),
            sources=tuple(str(s) for s in data.get("sources") or ()),
            assumptions=tuple(str(s) for s in data.get("assumptions") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "memory_bandwidth": self.memory_bandwidth,
            "peak_flops": dict(self.peak_flops),
            "sms": self.sms,
            "overhead": {"per_step_s": self.step_overhead_s},
            "sampling": {"per_step_s": self.sample_overhead_s},
            "host": {"per_step_s": self.host.per_step_s, "per_row_s": self.host.per_row_s},
            "attention": self.attention.to_dict(),
            "kernels": self.kernels.to_dict(),
            "interconnects": {k: v.to_dict() for k, v in self.interconnects.items()},
        }
        if self.links:
            out["links"] = {k: v.to_dict() for k, v in self.links.items()}
        if self.default_interconnect is not None:
            out["default_interconnect"] = self.default_interconnect
        if self.memory_capacity is not None:
            out["memory_capacity"] = self.memory_capacity
        if self.host_link is not None:
            out["host_link"] = self.host_link
        out["sources"] = list(self.sources)
        out["assumptions"] = list(self.assumptions)
        return out

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ProfileError(
                f"hardware {self.id}: no peak_flops for dtype {dtype} "
                f"(has {', '.join(sorted(self.peak_flops))})"
            )
        return self.peak_flops[dtype]

    def device(self, dtype: str) -> Device:
        return Device(self.memory_bandwidth, self.peak(dtype), self.sms, DTYPE_BYTES[dtype])


def hardware_spec_path(name: str | Path) -> Path:
    """A shipped spec by its stem (`h100-sxm`), or any spec file by path."""
    p = Path(name).expanduser()
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.is_file():
            raise ProfileError(f"hardware spec {name}: no such file")
        return p
    shipped = HARDWARE_DIR / f"{name}.yaml"
    if not shipped.is_file():
        known = ", ".join(sorted(q.stem for q in HARDWARE_DIR.glob("*.yaml")))
        raise ProfileError(f"hardware spec {name}: not shipped (shipped: {known}), nor a file")
    return shipped


def load_hardware_spec(name: str | Path) -> dict[str, Any]:
    """A spec file's contents, checked (`HardwareSpec.from_dict`), its `id` defaulting to
    the file's stem, and its carried interconnects worked out (`gpu.interconnects`)."""
    return _load_spec(name, ())


def _load_spec(name: str | Path, seen: tuple[str, ...]) -> dict[str, Any]:
    import json

    import yaml

    p = hardware_spec_path(name)
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ProfileError(f"hardware spec {p}: not readable ({exc})") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"hardware spec {p}: not a mapping")
    data.setdefault("id", p.stem)
    where = f"hardware spec {p}"
    links = resolve_interconnects(data, where, _load_spec, seen)
    if links:
        data["interconnects"] = links
    HardwareSpec.from_dict(data, where=where)
    return data
