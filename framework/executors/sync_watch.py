"""Which calls would make the host wait for a GPU, seen on any device.

On a GPU the host waits for the device whenever it needs a value the device computes (`item`,
`tolist`, `bool(t)`, `int(t)`, a boolean-mask index or `nonzero`, whose result's size is data)
and at every copy between host and device that is not asynchronous (`.to(device)`, `.cpu()`,
`copy_` without `non_blocking=True`). Each such call inside a step defeats deferred output,
whose point is that the host does not wait. On a CPU none of them waits, so a CPU test cannot
time them; it can see them: `SyncWatch` is a `TorchFunctionMode` that records every such call
made while it is active, with where it was made, and calls it as usual.

A `.to(...)` or `copy_` counts when it names a device (or is `.cpu()`/`.cuda()`), is not
`non_blocking=True`, and is not made inside an installed library: a dtype conversion stays on
its device, and a library's `.to(x.device)` moves what is there already. A read counts whatever the
tensor's device (the watch cannot tell a host tensor from a device one on a CPU), so the code
under watch keeps host values as Python lists until one asynchronous copy sends them.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

T = TypeVar("T")

READS = {
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero",
    "masked_select", "unique", "unique_consecutive", "bincount", "repeat_interleave",
}  # fmt: skip
MOVES = {"to", "copy_", "cpu", "cuda"}
# Copies are counted outside installed libraries: a library's `.to(x.device)` moves a tensor
# that is on the device already (a no-op on a GPU too), which a CPU cannot tell from a copy.
LIBRARIES = ("site-packages", "dist-packages")


def _device_named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if "device" in kwargs:
        return True
    return any(isinstance(a, torch.device | str) for a in args[1:])


def _bool_index(args: tuple[Any, ...]) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class SyncWatch(TorchFunctionMode):
    """Records (`calls`: name and the caller's file:line) every call that would wait on a
    GPU, while active (`with SyncWatch() as watch: ...`)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        waits = name in READS or (name in ("__getitem__", "__setitem__") and _bool_index(args))
        frame = None
        if name in MOVES and not kwargs.get("non_blocking", False):
            frame = traceback.extract_stack(limit=2)[0]
            moves = name in ("cpu", "cuda") or _device_named(args, kwargs)
            waits = waits or (moves and not any(lib in frame.filename for lib in LIBRARIES))
        if waits:
            frame = frame or traceback.extract_stack(limit=2)[0]
            self.calls.append(f"{name} at {frame.filename}:{frame.lineno}")
        return func(*args, **kwargs)


def watched(fn: Callable[..., T], found: list[list[str]]) -> Callable[..., T]:
    """`fn` run under a `SyncWatch` at each call, each call's findings appended to `found`:
    wrap an executor's `execute` (no wait inside a forward) or a readback's `fetch` (one a
    drain) to check a whole run."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        with SyncWatch() as watch:
            out = fn(*args, **kwargs)
        found.append(watch.calls)
        return out

    return call
