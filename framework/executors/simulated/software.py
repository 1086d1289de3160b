"""An engine's own software on the virtual clock (`executor.software=NAME`): the host time a
GPU step's kernels do not show, and how much of it the engine hides behind the device.

A step of a real engine spends, beside its kernels:

- `host`: scheduling and input preparation before the launch, as a function of the step's
  rows, query tokens and waiting requests;
- `launches`: each kernel issued from Python one by one (eager), or one CUDA-graph replay
  (decode steps up to a batch size, where the engine captures them);
- `output`: per sampled row, sampling's bookkeeping, output processing and detokenization,
  after the step's tokens come home;
- `server`: the API server's work per request and per streamed token, where it runs in the
  engine's process (`executor.api_server=true`).

The engine's `overlap` decides what of that the device hides:

| mode | a step's time on the clock |
| --- | --- |
| `none` | host + max(launch, device) + output |
| `async_output` | host + max(device, launch + the previous step's output) |
| `multi_step` (k) | as `async_output`, the host's scheduling once every k decode steps |
| `overlap_scheduler` | max(device, host + launch + output) |

(plus the server's seconds, in the engine's process, in every mode). An eager step's device
cannot end before its last kernel is issued, hence max(launch, device). The executor returns
what the device does not hide as the step's host seconds (`ExecResult.host_s`), which the
engine charges before the device's work on the clock and reports as the `software` phase of
`steps.csv`. `ideal` is no profile: a step is its kernels plus the hardware spec's round host
cost, as an engine with every overhead hidden.

Every number of a profile file is a `{value, source}` pair: a published breakdown, the
engine's code, its authors' profiles, or a measurement this project documents
(docs/simulator-software.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from framework.executors.simulated.features import StepFeatures

FORMAT = "nanoserve-software/1"
SOFTWARE_DIR = Path(__file__).resolve().parent / "software"
IDEAL = "ideal"
OVERLAPS = ("none", "async_output", "multi_step", "overlap_scheduler")
LAUNCHES = ("eager", "graphs")


class SoftwareError(ValueError):
    """A software profile that is missing or malformed: a user error, one line naming the
    field."""


@dataclass(frozen=True)
class Sourced:
    """One number of a profile and where it comes from."""

    value: float
    source: str


def shipped_software() -> list[str]:
    """The names `executor.software` accepts besides a path: `ideal` and every shipped file."""
    return [IDEAL, *sorted(p.stem for p in SOFTWARE_DIR.glob("*.yaml"))]


def software_path(name: str) -> Path:
    """The file `executor.software=name` reads: a shipped profile's name, or a path."""
    for candidate in (SOFTWARE_DIR / f"{name}.yaml", Path(name).expanduser()):
        if candidate.is_file():
            return candidate
    raise SoftwareError(
        f"executor.software={name}: not a shipped engine profile ({', '.join(shipped_software())}) "
        "nor a profile file"
    )


def read_profile(name: str, seen: tuple[str, ...] = ()) -> Any:
    """A profile file's fields, over those of the profile it names as its `base` (a shipped
    name or a path): an engine run with one setting changed (vLLM 0.6 with multi-step
    scheduling on) states only what differs, and keeps every other number and its source."""
    where = f"executor.software={seen[0] if seen else name}"
    try:
        data = yaml.safe_load(software_path(name).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SoftwareError(f"{where}: {name} not readable ({exc})") from None
    if not isinstance(data, dict) or "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or base in (*seen, name):
        raise SoftwareError(f"{where}: base must name another profile; got {base!r}")
    return merged(read_profile(base, (*seen, name)), data)


def merged(base: Any, over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base` field by field; a `{value, source}` pair replaces its whole pair,
    so a changed number never keeps the source of the number it replaced."""
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in over.items():
        inner = out.get(key)
        pair = isinstance(value, dict) and "value" in value
        out[key] = merged(inner, value) if isinstance(value, dict) and not pair else value
    return out


@dataclass(frozen=True)
class HostWork:
    """Scheduling and input preparation, before a step's launch."""

    per_step: Sourced
    per_row: Sourced  # per row in the forward
    per_token: Sourced  # per query token (a prompt's tokens, one per decode row)
    per_waiting: Sourced  # per request still waiting when the step was planned

    def seconds(self, f: StepFeatures, waiting: int) -> float:
        return (
            self.per_step.value
            + self.per_row.value * f.rows
            + self.per_token.value * f.num_tokens
            + self.per_waiting.value * waiting
        )


@dataclass(frozen=True)
class OutputWork:
    """Per step and per sampled row, after the tokens come home: sampling's bookkeeping,
    output processing, detokenization, stop checks."""

    per_step: Sourced
    per_row: Sourced

    def seconds(self, sampled_rows: int) -> float:
        return self.per_step.value + self.per_row.value * sampled_rows


@dataclass(frozen=True)
class Launches:
    """How a step's kernels reach the device: `eager` issues each from Python
    (kernels_per_layer x layers + kernels_per_step, each `per_kernel` of host time);
    `graphs` replays one captured graph (`replay`) for decode-only steps of at most
    `graph_max_batch` rows (every step when not `graph_decode_only`) and runs the rest
    eager."""

    mode: str
    kernels_per_layer: Sourced
    kernels_per_step: Sourced
    per_kernel: Sourced
    replay: Sourced | None = None
    graph_max_batch: Sourced | None = None
    graph_decode_only: bool = True

    def graphed(self, f: StepFeatures) -> bool:
        if self.mode != "graphs" or self.graph_max_batch is None:
            return False
        if self.graph_decode_only and f.prefill_rows:
            return False
        return f.rows <= self.graph_max_batch.value

    def seconds(self, f: StepFeatures, layers: int) -> float:
        if self.graphed(f):
            assert self.replay is not None  # checked when loaded
            return self.replay.value
        kernels = self.kernels_per_layer.value * layers + self.kernels_per_step.value
        return kernels * self.per_kernel.value


@dataclass(frozen=True)
class ServerWork:
    """The API server's work, charged only where it shares the engine's process
    (`in_engine_process`) and the run asks for it (`executor.api_server`)."""

    per_request: Sourced
    per_token: Sourced
    in_engine_process: bool

    def seconds(self, new_requests: int, sampled_rows: int) -> float:
        return self.per_request.value * new_requests + self.per_token.value * sampled_rows


@dataclass(frozen=True)
class SoftwareProfile:
    """One engine at one version (`software/NAME.yaml`)."""

    name: str
    engine: str
    version: str
    host: HostWork
    output: OutputWork
    launches: Launches
    overlap: str
    server: ServerWork
    multi_step: int = 1
    sources: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, name: str) -> SoftwareProfile:
        return cls.from_dict(read_profile(name), where=f"executor.software={name}")

    @classmethod
    def from_dict(cls, data: Any, where: str) -> SoftwareProfile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SoftwareError(f"{where}: not an engine software profile (format: {FORMAT})")
        read = _Reader(data, where)
        overlap = read.choice("overlap.mode", OVERLAPS)
        mode = read.choice("launches.mode", LAUNCHES)
        graphs = mode == "graphs"
        return cls(
            name=read.text("name"),
            engine=read.text("engine"),
            version=read.text("version"),
            host=HostWork(
                read.number("host.per_step_s"),
                read.number("host.per_row_s"),
                read.number("host.per_token_s"),
                read.number("host.per_waiting_s"),
            ),
            output=OutputWork(read.number("output.per_step_s"), read.number("output.per_row_s")),
            launches=Launches(
                mode,
                read.number("launches.kernels_per_layer"),
                read.number("launches.kernels_per_step"),
                read.number("launches.per_kernel_s"),
                read.number("launches.replay_s") if graphs else None,
                read.number("launches.graph_max_batch") if graphs else None,
                bool(read.get("launches.graph_decode_only", True)),
            ),
            overlap=overlap,
            multi_step=int(read.number("overlap.steps").value) if overlap == "multi_step" else 1,
            server=ServerWork(
                read.number("server.per_request_s"),
                read.number("server.per_token_s"),
                bool(read.get("server.in_engine_process", True)),
            ),
            sources=tuple(str(s) for s in data.get("sources") or ()),
            meta={k: data[k] for k in ("description",) if k in data},
        )

    def describe(self) -> str:
        """`vLLM 0.1.7 (eager, overlap none)`: metrics.json's `software`."""
        launches = self.launches.mode
        if self.launches.graph_max_batch is not None:
            launches += f" to batch {self.launches.graph_max_batch.value:g}"
        overlap = self.overlap + (f" {self.multi_step}" if self.overlap == "multi_step" else "")
        return f"{self.engine} {self.version} ({launches}, overlap {overlap})"


class _Reader:
    """Reads dotted fields of a profile, each error naming its field."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str) or not value:
            raise SoftwareError(f"{self.where}: {key} must be a non-empty string")
        return value

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.get(key)
        if value not in allowed:
            raise SoftwareError(
                f"{self.where}: {key} must be one of {', '.join(allowed)}; got {value!r}"
            )
        return str(value)

    def number(self, key: str) -> Sourced:
        node = self.get(key)
        if not isinstance(node, dict) or "value" not in node:
            raise SoftwareError(f"{self.where}: {key} must be {{value: NUMBER, source: TEXT}}")
        value, source = node["value"], node.get("source")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise SoftwareError(f"{self.where}: {key}.value must be a number >= 0; got {value!r}")
        if not isinstance(source, str) or not source.strip():
            raise SoftwareError(f"{self.where}: {key}.source must say where the number comes from")
        return Sourced(float(value), source)


@dataclass(frozen=True)
class SoftwareStep:
    """One step's software seconds, by part, and what of them the device did not hide."""

    host_s: float  # scheduling and input preparation
    launch_s: float  # issuing the kernels (or the graph's replay)
    output_s: float  # output processing of this step's sampled rows
    server_s: float  # the API server's share, where it runs in the engine's process
    exposed_s: float  # the clock's host seconds for the step: what the device did not hide


class SoftwareClock:
    """Prices one replica's steps under a profile, in order (async output and multi-step
    carry state from one step to the next)."""

    def __init__(
        self, profile: SoftwareProfile, layers: int, api_server: bool, speed: float = 1.0
    ) -> None:
        self.profile = profile
        self.layers = layers
        self.speed = speed  # `executor.speed`: the host is that much faster than the profile's
        self.api_server = api_server and profile.server.in_engine_process
        self._previous_output = 0.0  # async output: the last step's, done beside this one
        self._since_scheduled = 0  # multi-step: decode steps since the last scheduling

    def step(self, f: StepFeatures, device_s: float, waiting: int, new: int) -> SoftwareStep:
        """`f`'s step, whose kernels take `device_s` on the device (at the run's speed),
        planned with `waiting` requests still waiting and `new` requests starting their
        prompts."""
        p = self.profile
        sampled = f.rows  # a prompt's chunk short of its end counts: its row is processed too
        speed = self.speed
        host = p.host.seconds(f, waiting) / speed
        launch = p.launches.seconds(f, self.layers) / speed
        output = p.output.seconds(sampled) / speed
        server = p.server.seconds(new, sampled) / speed if self.api_server else 0.0
        if p.overlap == "none":
            exposed = host + output + max(0.0, launch - device_s)
        elif p.overlap == "overlap_scheduler":
            exposed = max(0.0, host + launch + output - device_s)
        else:  # async_output, multi_step: the last step's output beside this step's device
            if p.overlap == "multi_step":
                decode_only = f.prefill_rows == 0
                if decode_only and 0 < self._since_scheduled < p.multi_step:
                    host = 0.0  # scheduled with the first step of its run of k
                    self._since_scheduled += 1
                else:
                    self._since_scheduled = 1 if decode_only else 0
            exposed = host + max(0.0, launch + self._previous_output - device_s)
            self._previous_output = output
        return SoftwareStep(host, launch, output, server, exposed + server)
