"""Wiring for `executor=simulated`: the model's shape without its weights, the profile that
prices each step, the token streams, and the virtual clock.

The profile is the one named (`executor.profile`); else one shipped for this model x dtype
and measured on this CPU; else the analytic profile of the run's own model config on
`executor.hardware` (an H100 by default), computed at start, so that a simulation starts on
any machine for any model. A profile made for another model or dtype than the run's is
refused, naming both, unless `executor.any_profile=true` says that is what the user wants.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from framework.engine.clock import VirtualClock
from framework.executors.simulated.analytic import AnalyticProfile
from framework.executors.simulated.cost import (
    CostModel,
    device_beside_host,
    model_id,
    read_profile,
)
from framework.executors.simulated.executor import SimulatedExecutor
from framework.executors.simulated.gpu.hardware import HardwareSpec, load_hardware_spec
from framework.executors.simulated.gpu.model_shape import ModelShape as AnalyticShape
from framework.executors.simulated.links import LinkSpec, host_links
from framework.executors.simulated.load import load_cost_model
from framework.executors.simulated.software import IDEAL, SoftwareClock, SoftwareProfile
from framework.executors.simulated.swap_cost import BlockCopyCost, SwapCost
from framework.executors.simulated.tokens import TokenStreams, read_replay
from framework.run.config_checks import overlap_setting
from framework.tracking.machine import cpu_info

PROFILES = Path(__file__).resolve().parents[1] / "executors" / "simulated" / "profiles"


@dataclass
class ModelShape:
    """Stands in for a loaded model where only its config is needed (`model.config`)."""

    config: Any
    eos_token_id: int | None


def is_simulated(cfg: DictConfig) -> bool:
    return cfg.executor.name == "simulated"


def shipped_profiles() -> list[tuple[Path, dict[str, Any]]]:
    """Every profile shipped with nanoserve, with its `meta`."""
    found = []
    for path in sorted(PROFILES.glob("*.y*ml")) + sorted(PROFILES.glob("*.json")):
        meta = _shipped_meta(path, path.stat().st_mtime_ns)
        if meta is not None:  # a broken shipped file is a bug for the tests to find
            found.append((path, dict(meta)))
    return found


@functools.lru_cache(maxsize=512)
def _shipped_meta(path: Path, mtime_ns: int) -> dict[str, Any] | None:
    """A shipped profile's `meta`, parsed once per version of the file: every simulated run
    without `executor.profile` looks through them all, and parsing them took about half a
    second a replica, again for each job of a sweep and each probe of a goodput search."""
    try:
        return read_profile(path).get("meta") or {}
    except ValueError:
        return None


def choose_profile(cfg: DictConfig, shape: ModelShape) -> str | None:
    """`executor.profile` (a path, or the name of a shipped profile), else the profile shipped
    for this model x dtype and measured on this CPU (else on this CPU's microarchitecture);
    None when there is none: the run then takes the analytic profile of its own model on
    `executor.hardware` (`analytic_for`)."""
    name = cfg.executor.profile
    if name:
        for candidate in (Path(str(name)).expanduser(), PROFILES / name, PROFILES / f"{name}.yaml"):
            if candidate.is_file():
                return str(candidate)
        return str(name)  # reported as missing, by name, when it is read
    want = model_id(shape.config)
    matches = [
        (p, m)
        for p, m in shipped_profiles()
        if m.get("model_id") == want and m.get("dtype") == cfg.dtype and not m.get("analytic")
    ]
    by_cpu = [p for p, m in matches if machine_fit(m.get("machine") or {}) == 2]
    by_arch = [p for p, m in matches if machine_fit(m.get("machine") or {}) >= 1]
    for here in (by_cpu, by_arch):
        if len(here) == 1:
            return str(here[0])
    if len(by_arch) > 1:
        raise ValueError(
            f"executor.profile: {len(by_arch)} shipped profiles of {want} in {cfg.dtype} were "
            f"measured on this CPU's microarchitecture ({describe_cpu(cpu_info())}); name one "
            f"({', '.join(p.stem for p in by_arch)})"
        )
    return None


def analytic_for(cfg: DictConfig, shape: ModelShape) -> AnalyticProfile:
    """The analytic profile of the run's model config on `executor.hardware`, at the run's
    dtype and tensor-parallel degree: what a simulation uses with no profile of its own."""
    x = cfg.executor
    spec = HardwareSpec.from_dict(
        load_hardware_spec(x.hardware), where=f"executor.hardware={x.hardware}"
    )
    config = (
        shape.config.to_dict() if hasattr(shape.config, "to_dict") else dict(vars(shape.config))
    )
    return AnalyticProfile(
        hardware=spec,
        shape=AnalyticShape.from_config(config),  # refuses what it cannot price, in one line
        dtype=str(cfg.dtype),
        tensor_parallel=int(x.tensor_parallel),
        interconnect=interconnect_setting(x),
        meta={"made_by": f"executor.hardware={x.hardware} (computed at start)"},
    )


def with_tensor_parallel(cfg: DictConfig, cost: CostModel, path: str) -> CostModel:
    """The profile at `executor.tensor_parallel`: an analytic one re-priced for that many
    GPUs when it is above 1 (at the default 1, a named file keeps its own degree); a measured
    one only at 1 (it timed one device)."""
    x = cfg.executor
    tp = int(x.tensor_parallel)
    if not isinstance(cost, AnalyticProfile):
        if tp != 1:
            raise ValueError(
                f"executor.tensor_parallel={tp} needs an analytic GPU profile; {path} was "
                "measured on one device"
            )
        return cost
    asked = interconnect_setting(x) or cost.interconnect  # unset: the profile's own
    if tp == 1 or (cost.tensor_parallel, cost.interconnect) == (tp, asked):
        return cost
    meta = {k: v for k, v in cost.meta.items() if k not in ("tensor_parallel", "interconnect")}
    return AnalyticProfile(cost.hardware, cost.shape, cost.dtype, tp, asked, meta)


def interconnect_setting(x: Any) -> str | None:
    """`executor.interconnect`, or None: the hardware spec's `default_interconnect`."""
    return None if x.interconnect is None else str(x.interconnect)


def machine_fit(machine: dict[str, Any]) -> int:
    """How closely a profile's `meta.machine` is this CPU: 2 the same CPU (name, family and
    model numbers), 1 the same name and microarchitecture (another stepping or model of one
    generation), 0 another. A VM's CPU often names only the brand ("AMD EPYC" is both a Zen 3
    and a Zen 4 here), so the name alone cannot tell two shipped profiles apart."""
    here = cpu_info()
    if machine.get("cpu") != here["cpu"]:
        return 0
    if (machine.get("family"), machine.get("model_number")) == (
        here["family"],
        here["model_number"],
    ):
        return 2
    arch = here["microarchitecture"]
    return int(arch is not None and machine.get("microarchitecture") == arch)


def describe_cpu(cpu: dict[str, Any]) -> str:
    """`AMD EPYC, family 25 model 1 (zen3)`: the CPU as a profile's choice names it."""
    arch = f" ({cpu['microarchitecture']})" if cpu["microarchitecture"] else ""
    return f"{cpu['cpu']}, family {cpu['family']} model {cpu['model_number']}{arch}"


def check_profile(cfg: DictConfig, cost: CostModel, path: str, shape: ModelShape) -> None:
    """Refuse a profile for another model or dtype, naming both (`executor.any_profile`)."""
    if cfg.executor.any_profile:
        return
    meta = cost.meta or {}
    want = (model_id(shape.config), cfg.dtype)
    have = (meta.get("model_id"), meta.get("dtype"))
    if have != want:
        raise ValueError(
            f"executor.profile={path} is for {have[0]} in {have[1]}, this run is {want[0]} in "
            f"{want[1]}; set executor.any_profile=true to use it anyway"
        )


def build_simulated(
    cfg: DictConfig,
    shape: ModelShape,
    say: bool = True,
    block_bytes: int = 0,
    host_tier: bool = False,
) -> tuple[SimulatedExecutor, VirtualClock]:
    """The executor and the virtual clock of a simulated run (of one replica: `say` is
    whether it says which profile it uses, once for a whole cluster). `block_bytes`: one KV
    block's bytes, which a copy on the device (a fork's copy on write) and, with a host KV
    tier (`host_tier`), a swap over the host link copy."""
    path = choose_profile(cfg, shape)
    x = cfg.executor
    cost: CostModel
    if path is None:
        analytic = analytic_for(cfg, shape)
        cost = analytic
        path = f"analytic:{analytic.hardware.id}" + (
            f"-tp{x.tensor_parallel}" if x.tensor_parallel > 1 else ""
        )
        if say:
            tp = x.tensor_parallel
            print(
                f"executor=simulated: no profile measured on this CPU for {model_id(shape.config)} "
                f"in {cfg.dtype}; using the analytic profile of this model on "
                f"{analytic.hardware.name}"
                + (f" x{tp} ({analytic.interconnect})" if tp > 1 else "")
                + ": its seconds are an estimate for that GPU, not a measurement",
                file=sys.stderr,
            )
    else:
        cost = load_cost_model(path)
        check_profile(cfg, cost, path, shape)
        cost = with_tensor_parallel(cfg, cost, path)
    replay = read_replay(x.replay) if x.replay else None
    tokens = TokenStreams(
        shape.config.vocab_size, shape.eos_token_id, replay, float(x.mean_output_tokens)
    )
    speed = float(x.speed)
    host = None
    software = None
    if x.software != IDEAL:
        # Another engine's software replaces both of nanoserve's host times: its own host
        # work (`measured`) and the hardware spec's round per-step cost (`model`).
        profile = SoftwareProfile.load(str(x.software))
        layers = int(shape.config.num_hidden_layers)
        software = SoftwareClock(profile, layers, bool(x.api_server), speed)
        host = _no_host
    elif x.host_time == "model":
        host = cost.host.seconds if speed == 1 else lambda rows: cost.host.seconds(rows) / speed
    asked = overlap_setting(x.overlap)
    overlap = device_beside_host(cost) if asked is None else asked
    clock = VirtualClock(host_s=host, overlap=overlap)
    compute = None if x.compute_speed is None else float(x.compute_speed)
    # Under measured host time the engine's own host work flows into the clock, but not the
    # real executor's tensor preparation, which a simulated step skips: a measured profile
    # predicts it (`prepare`; zero in profiles older than it, and none in analytic ones).
    prep = getattr(cost, "prepare", None)
    prepare = prep.seconds if prep is not None and host is None else None
    readback = float(getattr(cost, "readback_s", 0.0))  # analytic profiles have none yet
    swap = copies = None
    if block_bytes:
        link = host_link(cfg, cost)
        if host_tier:
            swap = SwapCost(link, 2 * int(shape.config.num_hidden_layers), block_bytes)
        hardware = getattr(cost, "hardware", None)
        # A GPU's own memory, else (a profile measured on a CPU) the host's, one memory.
        bandwidth = hardware.memory_bandwidth if hardware is not None else link.bandwidth
        copies = BlockCopyCost(bandwidth, link.latency, block_bytes)
    executor = SimulatedExecutor(
        cost, tokens, path, speed, compute, prepare, readback, overlap, software, swap, copies
    )
    return executor, clock


def _no_host(rows: int) -> float:
    """The clock's modelled host time where an engine's software profile prices it instead
    (through each step's `ExecResult.host_s`)."""
    return 0.0


def host_link(cfg: DictConfig, cost: CostModel) -> LinkSpec:
    """The link a swap's copies take: `executor.host_link`, else the hardware spec's, else
    (a profile measured on a CPU, whose two tiers are one memory) `host_memory`."""
    name = cfg.executor.get("host_link")
    if name is None:
        hardware = getattr(cost, "hardware", None)
        name = getattr(hardware, "host_link", None) or "host_memory"
    links = host_links()
    if name not in links:
        raise ValueError(f"executor.host_link must be one of {', '.join(links)}; got {name!r}")
    return links[name]
