"""Building nanoserve's CPU kernels: one extension, compiled on first use.

The C++ sources are compiled together by `torch.utils.cpp_extension` the first time an engine
asks for one of their operators (23 s on the 2-core AVX2 EPYC VM: they include ATen and the
operator registry only, not `torch/extension.h`, whose C++ frontend and pybind11 took the same
build 68 s) and cached under PyTorch's extensions directory (`TORCH_EXTENSIONS_DIR`, by default
~/.cache/torch_extensions), rebuilt only when a source changes. Their operators live under
`torch.ops.nanoserve`.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

HERE = Path(__file__).parent
SOURCES = tuple(
    HERE / name
    for name in ("paged_decode.cpp", "argmax.cpp", "glue.cpp", "decode_attention.cpp", "gemv.cpp")
)
HEADERS = tuple(sorted(HERE.glob("*.h")))
# -fopenmp: `at::parallel_for` is a header template that runs its OpenMP loop only when the
# extension itself is compiled with OpenMP; without it the kernels used one core whatever
# torch's thread count (measurably slower on 2 cores at 16-64 rows). The loop then runs on the
# libgomp torch already loaded (one pool, sized by torch.set_num_threads).
# -ffp-contract=off: a multiply and an add stay two roundings, as in eager PyTorch, so the
# layer glue (`glue.cpp`) gives eager's bits (the other kernels write their FMAs explicitly).
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off"]
LDFLAGS = ["-fopenmp"]


def unavailable() -> str | None:
    """Why nanoserve's kernels cannot run on this CPU, or None when they can: AVX2, and the
    build succeeded (tried once per process)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"this CPU lacks AVX2 ({capability})"
    return build_error()


@functools.cache
def build_error() -> str | None:
    """Compile and load the kernels once per process; the error, if that failed."""
    from torch.utils.cpp_extension import load

    # PyTorch rebuilds when a source or a flag changes, not a header: the headers' digest is a
    # flag, so that editing one rebuilds too.
    digest = hashlib.sha256(b"".join(h.read_bytes() for h in HEADERS)).hexdigest()[:16]
    try:
        load(
            "nanoserve_cpu_kernels",
            [str(s) for s in SOURCES],
            extra_cflags=[*FLAGS, f"-DNANOSERVE_HEADERS_{digest}"],
            extra_ldflags=LDFLAGS,
            is_python_module=False,
        )
    except Exception as exc:  # no compiler or ninja, a read-only cache: the portable path
        return f"it did not build: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
    return None
