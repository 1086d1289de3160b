"""Which CPU a number was measured on: its name, its family/model numbers (a VM's CPU often
names only the brand, "AMD EPYC") and the ISA flags that decide which kernels run and how
fast (AVX2, AVX-512, native bf16, AMX). Read from /proc/cpuinfo; empty where there is none.

Every benchmark, profile and kernel choice says which of these it ran on, so that a figure
from one machine is never read as another's.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

ISA = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")


@functools.cache
def _cpuinfo() -> tuple[str | None, frozenset[str], int | None, int | None]:
    name = family = model = None
    flags: frozenset[str] = frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and name is None:
                name = value.strip()
            elif key == "flags" and not flags:
                flags = frozenset(value.split())
            elif key == "cpu family" and family is None:
                family = int(value)
            elif key == "model" and model is None:
                model = int(value)
    except (OSError, ValueError):
        pass
    return name, flags, family, model


def cpu_model() -> str:
    """The CPU as lscpu names it ("model name"), else what the platform says."""
    return _cpuinfo()[0] or platform.processor() or platform.machine()


def isa_flags() -> dict[str, bool]:
    """Whether this CPU has each flag of `ISA`."""
    flags = _cpuinfo()[1]
    return {f: f in flags for f in ISA}


def isa_summary() -> str:
    """The `ISA` flags this CPU has, comma-separated ("none" if it has none of them)."""
    return ",".join(f for f, on in isa_flags().items() if on) or "none"


def cpu_info() -> dict[str, Any]:
    """The CPU's name, family/model numbers, microarchitecture (where known), cores and
    `ISA` flags: what a profile or a benchmark records of the machine it measured."""
    _, _, family, model = _cpuinfo()
    name = cpu_model()
    return {
        "cpu": name,
        "family": family,
        "model_number": model,
        "microarchitecture": microarchitecture(name, family, model),
        "cores": os.cpu_count(),
        "isa": isa_flags(),
    }


def microarchitecture(name: str, family: int | None, model: int | None) -> str | None:
    """AMD's Zen generation from its family/model numbers; None where unknown."""
    if "AMD" not in name or family is None or model is None:
        return None
    if family == 23:
        return "zen2" if model >= 0x30 else "zen"
    if family == 25:
        return "zen4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0xAF else "zen3"
    if family == 26:
        return "zen5"
    return None
