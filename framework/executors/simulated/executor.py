"""`SimulatedExecutor`: the engine's `Executor` with no model behind it. Each step's cost is
the cost model's prediction from the batch's features; each row's token comes from the
request's deterministic stream. The engine, the policies, the invariants and every count are
the real ones; only the seconds are predicted (on the engine's virtual clock)."""

from __future__ import annotations

from collections.abc import Callable

from framework.engine.batch import StepBatch
from framework.engine.executor import ExecResult
from framework.executors.simulated.cost import CostModel
from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.software import SoftwareClock
from framework.executors.simulated.swap_cost import BlockCopyCost, SwapCost
from framework.executors.simulated.tokens import TokenStreams


class SimulatedExecutor:
    # Predicts from shapes: a prompt's cache slots (a list as long as the prompt) go unread.
    reads_slots = False

    def __init__(
        self,
        cost: CostModel,
        tokens: TokenStreams,
        profile: str = "",
        speed: float = 1.0,
        compute_speed: float | None = None,
        prepare: Callable[[StepFeatures], float] | None = None,
        readback_s: float = 0.0,
        overlap: bool = False,
        software: SoftwareClock | None = None,
        swap: SwapCost | None = None,
        copies: BlockCopyCost | None = None,
    ) -> None:
        self.cost = cost
        self.tokens = tokens
        self.profile = profile
        # The machine against the profile's (`executor.speed`): a what-if (a machine 2x
        # faster), or the state a shared VM is in today against the quiet one it was
        # profiled in (`python -m experiments.sim_check --speed auto`). `compute_speed` (None: the
        # same) divides the forward's compute-bound seconds apart (`StepCost.compute_s`):
        # a machine with the bandwidth of this one and twice its FLOP/s, or neighbours that
        # take memory bandwidth and leave the arithmetic alone.
        self.speed = speed
        self.compute_speed = speed if compute_speed is None else compute_speed
        # The real executor's tensor preparation (ids, positions, slot mapping, block
        # tables), which a simulated step does not do: predicted from the profile when the
        # engine's host time is measured (`executor.host_time=measured`), so that the
        # simulated clock is not short by it. None under `model`, whose host cost covers it.
        self.prepare = prepare
        # One readback of held sampled tokens, as the profile measured it (`readback_s`),
        # at this machine's speed: the engine charges it on the virtual clock at each drain
        # and gives it to the output policies as the measured transfer cost, where a real
        # run times the device-to-host copy (here a list join, which would price nothing).
        self.readback_s = readback_s / speed
        # The device runs beside the host (a GPU; the clock's `overlap`): said in
        # metrics.json and MLflow, since it changes what deferred output is worth.
        self.overlap = overlap
        # The keys a query attends at most (a sliding window) where the cost model prices
        # attention over what it reads (an analytic profile of Mistral 7B); None elsewhere,
        # as for a measured profile, whose steps were timed on whatever its kernels read.
        self.window: int | None = getattr(cost, "attention_window", None)
        # The serving engine's own software (`executor.software`; None: `ideal`): the host
        # seconds of each step that its kernels do not show, priced from the step's shape
        # and its device seconds (`framework.executors.simulated.software`).
        self.software = software
        # What a swap's block copies cost over the host link (None: no host tier).
        self.swap = swap
        # What a step's copies on the device cost (a fork's copy on write; None: not priced,
        # for an executor built without its model's block size).
        self.copies = copies

    def describe(self) -> dict[str, str]:
        out = {"executor": "simulated", "cost_model": self.cost.kind, "profile": self.profile}
        meta = self.cost.meta or {}
        if self.cost.kind == "analytic":
            out["hardware"] = str(meta.get("hardware", ""))
            out["tensor_parallel"] = str(meta.get("tensor_parallel", 1))
            if meta.get("interconnect"):
                out["interconnect"] = str(meta["interconnect"])
        out["overlap"] = "host and device" if self.overlap else "none"
        if self.speed != 1:
            out["speed"] = f"{self.speed:g}"
        if self.compute_speed != self.speed:
            out["compute_speed"] = f"{self.compute_speed:g}"
        if self.software is not None:
            out["software"] = self.software.profile.name
            out["software_is"] = self.software.profile.describe()
            out["api_server"] = "in the engine's process" if self.software.api_server else "none"
        if self.swap is not None:
            out["host_link"] = self.swap.describe()
        if self.copies is not None:
            out["block_copies"] = self.copies.describe()
        return out

    def swap_seconds(self, blocks: int) -> float:
        """Predicted seconds to copy `blocks` KV blocks one way over the host link."""
        return self.swap.seconds(blocks) if self.swap is not None else 0.0

    def prefill_seconds(self, tokens: int) -> float:
        """Predicted forward seconds of `tokens` prefilled again, as one row."""
        if tokens <= 0:
            return 0.0
        one = StepFeatures.prompt(tokens)
        cost = self.cost.predict(one)
        return (cost.forward_s - cost.compute_s) / self.speed + cost.compute_s / self.compute_speed

    def execute(self, batch: StepBatch) -> ExecResult:
        features = StepFeatures.of(batch, self.window)
        cost = self.cost.predict(features)
        # A chunk short of its prompt's end samples nothing: its entry is never read.
        ids = self.tokens.tokens(batch.rows)
        compute_s = cost.compute_s
        forward_s = (cost.forward_s - compute_s) / self.speed + compute_s / self.compute_speed
        sample_s = cost.sample_s / self.speed
        host_s = 0.0
        if self.software is not None:
            new = sum(1 for r in batch.rows if r.start_pos == 0)  # requests starting a prompt
            step = self.software.step(features, forward_s + sample_s, batch.waiting, new)
            host_s = step.exposed_s
        return ExecResult(
            tokens=ids,  # host values: no tensor to build, nothing to read back
            forward_s=forward_s,
            sample_s=sample_s,
            prepare_s=self.prepare(features) / self.speed if self.prepare else 0.0,
            host_s=host_s,
            swap_s=self._swap_s(batch),
        )

    def _swap_s(self, batch: StepBatch) -> float:
        """The step's block copies: between the tiers over the host link, and on the
        device (copies on write)."""
        swaps = batch.swaps
        on_device = self.copies.seconds(len(batch.copies)) if self.copies is not None else 0.0
        if not swaps:
            return on_device
        if self.swap is None:
            raise RuntimeError("a step asks for KV swaps of a simulator with no host link")
        return self.swap.seconds(len(swaps.out)) + self.swap.seconds(len(swaps.into)) + on_device
