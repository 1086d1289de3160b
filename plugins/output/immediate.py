"""Immediate output: read the sampled tokens back to the host after every forward.
The reference every deferred policy must match token for token."""

from __future__ import annotations

from dataclasses import dataclass

from framework.api import OutputPolicy, OutputView, PolicyConfig, hookimpl


@dataclass
class ImmediateConfig(PolicyConfig):
    pass


class ImmediateOutput(OutputPolicy):
    """Reads the sampled tokens back after every forward: the reference."""

    def keep(self, view: OutputView) -> int:
        return 0


@hookimpl
def register_outputs(register) -> None:  # type: ignore[no-untyped-def]
    register("immediate", ImmediateOutput, ImmediateConfig)
