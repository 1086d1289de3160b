"""Which path the Linear layers take on CPU, chosen by timing on this machine (the rules and
reporting of `kernel_choice`): oneDNN's prepacked weights or stock PyTorch
(`engine.packed_linears`), and up to how many rows nanoserve's own Linear kernel
(`kernels/gemv.cpp`, `engine.small_linear`) takes them from either.

Why two choices: packing is a copy of every weight, decided once for all row counts; the
kernel reads the layer's own weight and wins or loses by row count (on the EPYC VMs it won at
1 to 8-16 rows in fp32 and at every count in bf16 where the CPU has no bf16 instructions), so
its choice is a row count, found by a climb.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from framework.executors.kernel_choice import Choice, best_of, setting
from framework.executors.kernels.build import unavailable
from framework.executors.packed_linear import (
    EVERY_ROW,
    PACKED,
    can_pack,
    pack_linears,
    set_small_rows,
    small_layers,
    unpack_linears,
)

LINEAR_ROWS = (1, 16, 64)  # a lone decode row, a decode batch, a large batch or a prompt
MARGIN = 0.97  # packing holds every weight twice: it must win by more than noise
# The row counts nanoserve's Linear kernel is timed at, climbing until the current path wins:
# where that happens moves with the CPU and dtype (in fp32 between 3 and 16 rows on the EPYC
# VMs; in bf16 without a bf16 matrix unit, never: the kernel won at every count).
SMALL_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 256)
# Up to this many rows a rung times every layer (weights cold, as a decode step reads them);
# above, the leading layers that make `SMALL_RUNG_MACS` multiply-adds: there the product is
# bound by the multiplies, which a few layers show as well as all, and every layer at 256
# rows took seconds a pass in bf16 on the AVX2 VM (the whole climb took 10 s of start-up).
SMALL_WHOLE_ROWS = 4
SMALL_RUNG_MACS = 1 << 28


# ---- Linear layers ------------------------------------------------------------------------
@torch.inference_mode()
def _linear_times(model: nn.Module) -> dict[str, float]:
    """Seconds of one pass through every Linear layer at each of `LINEAR_ROWS` rows, stock
    and packed (the packed copies must exist)."""
    dtype = next(model.parameters()).dtype
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    inputs = {n: [torch.randn(n, m.in_features, dtype=dtype) for m in linears] for n in LINEAR_ROWS}

    def stock() -> None:
        for n in LINEAR_ROWS:
            for m, x in zip(linears, inputs[n], strict=True):
                F.linear(x, m.weight, m.bias)

    def packed() -> None:
        op = torch.ops.mkldnn._linear_pointwise
        for n in LINEAR_ROWS:
            for m, x in zip(linears, inputs[n], strict=True):
                op(x, getattr(m, PACKED), m.bias, "none", [], "")

    return best_of({"stock": stock, "packed": packed})


def choose_linears(model: nn.Module, value: Any) -> Choice:
    """Pack the model's Linear layers for oneDNN, or not; and do it (or undo it)."""
    want = setting(value, "packed_linears")
    if not can_pack(model):
        unpack_linears(model)
        param = next(model.parameters())
        if param.device.type == "cpu" and param.dtype == torch.bfloat16:
            why = "oneDNN's bfloat16 path needs AVX512-BW/VL/DQ or AVX-NE-CONVERT, not on this CPU"
            return Choice(False, "unavailable", why)
        why = f"oneDNN packing is for CPU float32 / bfloat16 (this model: {param.device.type}, "
        return Choice(False, "unavailable", why + f"{param.dtype})")
    if want is not None:
        pack_linears(model) if want else unpack_linears(model)
        return Choice(want, "set", "")
    key = (_shape(model), next(model.parameters()).dtype, torch.get_num_threads())
    choice = _LINEARS.get(key)
    if choice is None:
        pack_linears(model)
        choice = _LINEARS[key] = _measured_linears(_linear_times(model))
    # Applied to this model object: another engine may have packed or unpacked it since.
    pack_linears(model) if choice.use else unpack_linears(model)
    return choice


# Measured once per process for each model shape x dtype x thread count: the answer depends on
# the layers' shapes, not on which object holds them (tests and sweeps load many of one shape).
_LINEARS: dict[tuple[Any, ...], Choice] = {}


def _shape(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """The model's Linear layers' (in, out) features, in order: what their timing depends on."""
    return tuple(
        (m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)
    )


def _measured_linears(t: dict[str, float]) -> Choice:
    """The rule on measured seconds: pack only for a clear win."""
    use = t["packed"] < MARGIN * t["stock"]
    rows = "/".join(map(str, LINEAR_ROWS))
    why = f"packed {1e3 * t['packed']:.3g} ms, stock {1e3 * t['stock']:.3g} ms a pass"
    why += f" at {rows} rows"
    return Choice(use, "measured", why)


# ---- nanoserve's Linear kernel ------------------------------------------------------------
def choose_small_linears(model: nn.Module, value: Any, packed_value: Any) -> Choice:
    """Up to how many rows (0: none; `EVERY_ROW`: all) the model's Linear layers run
    nanoserve's Linear kernel (`kernels/gemv.cpp`) in place of the path `choose_linears` left
    them on; and do it. Call it after `choose_linears`. `engine.packed_linears=false` keeps
    the stock `nn.Linear` everywhere unless this is set true."""
    want = small_setting(value)
    if want is None and setting(packed_value, "packed_linears") is False:
        set_small_rows(model, 0)
        return Choice(False, "set", "stock Linear: engine.packed_linears=false")
    if want == 0:
        set_small_rows(model, 0)
        return Choice(False, "set", "")
    param = next(model.parameters())
    on = param.device.type
    reason = unavailable() if on == "cpu" else f"it runs on CPU only (this model: {on})"
    if reason is None and not small_layers(model):
        reason = f"no CPU float32 / bfloat16 Linear layer (this model: {param.dtype})"
    if reason is not None:
        set_small_rows(model, 0)
        return Choice(False, "unavailable", reason)
    if want is not None:
        set_small_rows(model, want)
        return Choice(True, "set", rows_said(want))
    packed = any(hasattr(m, PACKED) for m in model.modules())
    key = (_shape(model), param.dtype, torch.get_num_threads(), packed)
    if key not in _SMALL:
        set_small_rows(model, 0)  # the current path timed as it is
        _SMALL[key] = _measured_small(_small_times(model))
    rows, choice = _SMALL[key]
    set_small_rows(model, rows)
    return choice


def small_setting(value: Any) -> int | None:
    """`engine.small_linear` as a row count (0: off; `EVERY_ROW`: `true`), or None for
    `auto`. A count pins what a climb would choose, so that runs compared with each other
    (an A/B, the same-speed check) run the same kernels without measuring them again."""
    if not isinstance(value, bool) and str(value).strip().isdigit() and int(value) >= 1:
        return int(value)
    try:
        want = setting(value, "small_linear")  # auto, true or false
    except ValueError:
        raise ValueError(
            "engine.small_linear must be auto (chosen by a measurement on this machine), true"
            " (every row count), false, or a row count >= 1 (the kernel up to that many rows);"
            f" got {value!r}"
        ) from None
    return None if want is None else EVERY_ROW if want else 0


def small_pin(said: str) -> str:
    """The `engine.small_linear` value that reproduces a run's reported choice
    (`metrics.json`'s `small_linear`: "kernel (measured: up to 8 rows; ...)", "off (...)")."""
    if not said.startswith("kernel "):
        return "false"
    if "every row count" in said:
        return "true"
    rows = re.search(r"up to (\d+) rows", said)
    return rows.group(1) if rows else "true"


# As `_LINEARS`, with whether the layers are packed: up to how many rows, and the choice.
_SMALL: dict[tuple[Any, ...], tuple[int, Choice]] = {}


def rows_said(rows: int) -> str:
    return "at every row count" if rows >= EVERY_ROW else f"up to {rows} rows"


@torch.inference_mode()
def _small_times(model: nn.Module) -> dict[int, dict[str, float]]:
    """Seconds of one pass through the Linear layers (`rung_layers`) at each rung of
    `SMALL_LADDER`, by the kernel and by the layers' current path (packed or stock), in
    alternating rounds; the climb stops at the first rung the current path wins."""
    dtype = next(model.parameters()).dtype
    linears = small_layers(model)
    kernel = torch.ops.nanoserve.small_linear
    times = {}
    for n in SMALL_LADDER:
        layers = rung_layers(linears, n)
        xs = [torch.randn(n, m.in_features, dtype=dtype) for m in layers]

        def small(layers: list[nn.Linear] = layers, xs: list[torch.Tensor] = xs) -> None:
            for m, x in zip(layers, xs, strict=True):
                kernel(x, m.weight, m.bias)

        def current(layers: list[nn.Linear] = layers, xs: list[torch.Tensor] = xs) -> None:
            for m, x in zip(layers, xs, strict=True):
                m(x)  # packed or stock: the kernel is not set yet

        times[n] = best_of({"kernel": small, "current": current})
        if times[n]["kernel"] >= times[n]["current"]:
            break
    return times


def rung_layers(linears: list[nn.Linear], rows: int) -> list[nn.Linear]:
    """The layers a rung of `rows` rows is timed on: all of them up to `SMALL_WHOLE_ROWS`
    rows, above that the fewest leading ones whose multiply-adds at `rows` rows reach
    `SMALL_RUNG_MACS` (at least one, at most all)."""
    if rows <= SMALL_WHOLE_ROWS:
        return linears
    layers: list[nn.Linear] = []
    size = 0
    for m in linears:
        if layers and size * rows >= SMALL_RUNG_MACS:
            break
        layers.append(m)
        size += m.weight.numel()
    return layers


def _measured_small(t: dict[int, dict[str, float]]) -> tuple[int, Choice]:
    """The rule on measured seconds: the kernel up to the last rung of an unbroken run, from
    the first, where it is faster; at every row count where it won every rung."""
    rows = 0
    for n in SMALL_LADDER:
        if n not in t or t[n]["kernel"] >= t[n]["current"]:
            break
        rows = n
    else:
        rows = EVERY_ROW
    pairs = ", ".join(
        f"{n} rows {1e3 * v['kernel']:.3g}/{1e3 * v['current']:.3g}" for n, v in sorted(t.items())
    )
    why = f"{rows_said(rows)}; kernel/current ms a pass: {pairs}"
    return rows, Choice(rows > 0, "measured", why)
