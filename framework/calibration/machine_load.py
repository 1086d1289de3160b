"""How loaded the machine is while something is measured on it. A shared VM's neighbours slow
every measured step, so the calibration and the tools read how much of the CPUs other
processes took while they measured, and time calls the same way on a CPU and on a GPU."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def cpu_seconds() -> tuple[float, float]:
    """(all CPUs' busy seconds from /proc/stat, this process's CPU seconds); zeros where
    /proc is not there (then no run is ever seen as disturbed). Two readings give the share
    of the CPUs that other processes took between them (`foreign_share`)."""
    busy = 0.0
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0, 0.0
    own = resource.getrusage(resource.RUSAGE_SELF)
    return busy, own.ru_utime + own.ru_stime


def foreign_share(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """The share of all CPUs that other processes used between two `cpu_seconds()` readings
    `wall` seconds apart."""
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others) / (max(wall, 1e-9) * (os.cpu_count() or 1))


def others_share(window_s: float = 0.5) -> float:
    """The share of all CPUs that other processes used over the next `window_s` seconds
    (this process sleeps meanwhile)."""
    before = cpu_seconds()
    time.sleep(window_s)
    return foreign_share(before, cpu_seconds(), window_s)


def sync(device: torch.device) -> None:
    """Wait for a GPU's queued work, so that a clock read after it includes that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """The fastest of `repeats` timed calls, after one untimed call (warm caches, pools)."""
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best
