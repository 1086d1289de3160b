"""The one seam between the engine and what runs the model: a `StepBatch` in, an `ExecResult`
out.

The engine never touches logits or weights, and never imports an executor: whatever is
handed to it with an `execute` method serves. The Hugging Face runner
(`framework.executors.hf.HFExecutor`) is one; an executor that predicts costs instead of
running a model can replace it without changing any policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from framework.engine.batch import StepBatch
    from framework.engine.scores import Scores

# What the parts of a device span time, in order: the forward, then the sampler.
SPAN_PARTS = ("forward", "sample")


class Span(Protocol):
    """An executor's record of a step's device time (`framework.executors.device_time`)."""

    decode_rows: int  # rows of a step of decode rows alone; 0 where it had a prefill row

    def parts(self) -> tuple[float, ...] | None:
        """Each part's device seconds (`SPAN_PARTS` order); None while not done. No wait."""
        ...

    def wait(self) -> tuple[float, ...]:
        """The same, after waiting for the device: at a run's end only."""
        ...


@dataclass
class ExecResult:
    """One step's sampled tokens and what producing them cost."""

    # [rows] sampled ids, still on the device; a plain list from an executor that has no
    # device (the simulator), which the engine then never converts or copies
    tokens: torch.Tensor | list[int]
    forward_s: float  # the model call alone, on the host's clock (on CUDA: its launches)
    sample_s: float
    prepare_s: float = 0.0  # host work turning the batch into device tensors (block tables)
    # A simulated engine's own software (`executor.software`): the host seconds of its
    # scheduling, launches and output processing that the device did not hide, charged on
    # the virtual clock before the step's device work. 0 for a real executor, whose host
    # time is its own.
    host_s: float = 0.0
    # KV blocks copied before the forward, between the device and the host tier
    # (`StepBatch.swaps`) and within the device (`StepBatch.copies`): measured by a real
    # executor, predicted by a simulator.
    swap_s: float = 0.0
    # On CUDA, events around the forward and the sampler on the device's stream: their
    # device seconds, read when the step's tokens are drained. None where the host's
    # seconds are the device's (a CPU, a simulator).
    span: Span | None = None
    # The log-probabilities the step's rows asked for (`framework.engine.scores`), on the
    # device like the tokens; None where no row asked, or the executor computes none.
    scores: Scores | None = None


class Executor(Protocol):
    """Runs one step: every row of `batch` through the model, one token sampled per row.

    An executor may also set `reads_slots = False`: it reads the rows' shapes only (token
    counts, positions, contexts, block tables), never `Row.slots`, so the engine leaves a
    prefill row's slot list empty instead of mapping every prompt position to its cache
    slot. It still checks that each row's block table covers what the step writes.
    """

    def execute(self, batch: StepBatch) -> ExecResult: ...


def describe(executor: Any) -> dict[str, str]:
    """What an executor says of itself (`describe()`: its name, and for a simulator what its
    costs come from), for metrics.json; an executor that says nothing is named by its class."""
    said = getattr(executor, "describe", None)
    return dict(said()) if callable(said) else {"executor": type(executor).__name__}
