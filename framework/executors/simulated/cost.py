"""The `CostModel` protocol: a step's features in, its predicted seconds out; and loading a
profile file (YAML or JSON) into the cost model its `kind` names.

A profile describes one model x machine x dtype. Its `meta` says which (model id, dtype,
device, CPU model and ISA flags or GPU name, date, commit), so that a run can refuse a profile
made for another model or dtype, and every result can say what it was predicted from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from framework.executors.simulated.features import StepFeatures

FORMAT = "nanoserve-profile/1"


@dataclass(frozen=True)
class StepCost:
    forward_s: float  # the model call
    sample_s: float  # logits to tokens
    # Of forward_s, the seconds that go with the machine's arithmetic (the Linear layers'
    # per-token work, attention's products) rather than its memory bandwidth and fixed
    # costs: what `executor.compute_speed` divides, apart from `executor.speed`. A shared
    # VM's neighbours slow the two by different amounts (docs/simulator-validation.md).
    compute_s: float = 0.0


@dataclass
class HostCost:
    """The engine's own host work per step, for `executor.host_time=model`: deterministic,
    and right for a machine that is not this one."""

    per_step_s: float = 0.0
    per_row_s: float = 0.0

    def seconds(self, rows: int) -> float:
        return self.per_step_s + self.per_row_s * rows


class CostModel(Protocol):
    kind: str  # "measured" or "analytic": said wherever its numbers show
    meta: dict[str, Any]  # model, dtype, device, machine, date, commit, source
    host: HostCost

    def predict(self, features: StepFeatures) -> StepCost: ...


def device_beside_host(cost: CostModel) -> bool:
    """Whether the profile's device runs its queue while the host works: a GPU (every
    analytic profile, and one measured on CUDA). A CPU's forward runs on the host's own
    cores, so host and forward take turns."""
    return cost.kind == "analytic" or (cost.meta or {}).get("device_type") == "cuda"


@dataclass
class ProfileError(ValueError):
    """A profile that is missing, malformed, or made for another model or dtype; a user
    error (one line, naming the field)."""

    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def read_profile(path: str | Path) -> dict[str, Any]:
    """The profile file's contents, checked for the format marker and a known `kind`."""
    import json

    import yaml

    p = Path(path).expanduser()
    if not p.is_file():
        raise ProfileError(f"executor.profile={path}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProfileError(f"executor.profile={path}: not a readable profile ({first})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"executor.profile={path}: not a nanoserve profile (format: {FORMAT})")
    if data.get("kind") not in ("measured", "analytic"):
        raise ProfileError(
            f"executor.profile={path}: kind must be measured or analytic; got {data.get('kind')!r}"
        )
    return data


def model_id(config: Any) -> str:
    """A model's shape as one string (`LlamaForCausalLM-L30-H576-A9-KV3-V49152`): what a
    profile is for. Two checkpoints of one shape cost the same, so the shape, not the name,
    is what must match."""
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return (
        f"{arch}-L{config.num_hidden_layers}-H{config.hidden_size}-A{heads}-KV{kv}"
        f"-V{config.vocab_size}"
    )
