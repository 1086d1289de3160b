"""A/B of the paged decode kernel's source: two builds in one process, alternating rounds.

    python -m experiments.kernel_ab                 # the working tree against HEAD
    python -m experiments.kernel_ab --base 653f0f7 --rounds 9 --threads 2
    python -m experiments.kernel_ab --cold     # the cache read from memory, as in a step

`framework/executors/kernels/paged_decode.cpp` as it is now (B) and as it was at `--base` (A)
are compiled side by side under their own operator namespaces (`--base-flags` lets A keep
the build flags it had then), then timed on SmolLM2's attention shapes (9 query heads, 3 kv
heads, head size 64, 16-token blocks) at a few (rows x context) sizes, in fp32 and bf16, in
rounds that alternate which goes first. Each call is the whole decode attention: scores,
PyTorch's softmax, weighted values. Both builds must give the same output (to fp32
summation order) before any time is reported.

Why one process: on a shared VM two runs minutes apart differ by more than most kernel changes
are worth; interleaved rounds in one process see the same machine. Each size's result is the
median of the rounds' ratios A/B (above 1: B is faster) and their range. Contexts are drawn
within +-25% of the size's, and every row's blocks lie at random places in the pool, as a long-
running engine leaves them.
"""

from __future__ import annotations

import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from experiments.toolkit import cli
from framework.executors.kernels.paged_decode import FLAGS, SOURCE
from framework.run.paths import ROOT

SIZES = ((1, 256), (16, 256), (64, 80), (64, 512), (32, 1024))  # (rows, context)


def build(
    source: str, headers: dict[str, str], namespace: str, flags: list[str], folder: Path
) -> None:
    """Compile `source` (with the kernels' `headers` of the same version beside it) with its
    operators under `torch.ops.<namespace>`."""
    own = folder / namespace
    own.mkdir()
    for name, text in headers.items():
        (own / name).write_text(text)
    path = own / f"{namespace}.cpp"
    path.write_text(source.replace("TORCH_LIBRARY(nanoserve", f"TORCH_LIBRARY({namespace}"))
    ldflags = [f for f in flags if f == "-fopenmp"]  # as the engine links it (LDFLAGS)
    load(f"{namespace}_ext", [str(path)], extra_cflags=flags, extra_ldflags=ldflags,
         is_python_module=False)  # fmt: skip


def git_text(ref: str, path: Path) -> str:
    return subprocess.run(
        ["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def base_headers(ref: str) -> dict[str, str]:
    """The kernels' headers at `ref` (none before there were any)."""
    folder = SOURCE.parent.relative_to(ROOT)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", ref, f"{folder}/"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {Path(n).name: git_text(ref, Path(n)) for n in names if n.endswith(".h")}


def inputs(rows: int, ctx: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    """Queries, one layer's K and V pools, block tables (blocks at random) and lengths."""
    bs, q_heads, kv_heads, dim = 16, 9, 3, 64
    rng = random.Random(seed)
    lens = [max(1, ctx + rng.randint(-ctx // 4, ctx // 4)) for _ in range(rows)]
    need = [-(-n // bs) for n in lens]
    pool = sum(need) + 8
    k = torch.randn(pool * bs, kv_heads, dim).to(dtype)
    v = torch.randn_like(k)
    free = list(range(pool))
    rng.shuffle(free)
    blocks = torch.zeros(rows, max(need), dtype=torch.long)
    for i, n in enumerate(need):
        blocks[i, :n] = torch.tensor([free.pop() for _ in range(n)])
    return torch.randn(rows, q_heads, dim), k, v, blocks, torch.tensor(lens), bs


def attend(namespace: str, args: tuple) -> torch.Tensor:
    q, k, v, blocks, lens, bs = args
    ops = getattr(torch.ops, namespace)
    scores = ops.paged_scores(q, k, blocks, lens, bs, 0.125, 0)
    return ops.paged_mix(torch.softmax(scores, -1), v, blocks, lens, bs, 0)


def timed(namespace: str, batch: tuple, calls: int, flush: torch.Tensor | None) -> float:
    """Seconds a call, the mean of `calls`; with `flush`, each call after reading it through
    (untimed), so the call finds its cache in memory as it does inside a step."""
    total = 0.0
    for _ in range(calls):
        if flush is not None:
            flush.sum()
        t = time.perf_counter()
        attend(namespace, batch)
        total += time.perf_counter() - t
    return total / calls


def main(argv: list[str] | None = None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--base", default="HEAD", help="git ref of build A (default HEAD)")
    ap.add_argument(
        "--base-flags", default=None, help="A's compiler flags, space-separated (default: B's)"
    )
    cli.add_rounds(ap, 7, "timed rounds, the order alternating (7)")
    cli.add_threads(ap)
    ap.add_argument(
        "--cold",
        action="store_true",
        help="read a 64 MB buffer before each call (untimed), as a step's weights pass "
        "between layers, so that the cache is read from memory, not from L2/L3",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rel = SOURCE.relative_to(ROOT)
    base_src = git_text(args.base, rel)
    base_flags = args.base_flags.split() if args.base_flags is not None else FLAGS
    ours = {h.name: h.read_text() for h in SOURCE.parent.glob("*.h")}
    with tempfile.TemporaryDirectory() as tmp:
        build(base_src, base_headers(args.base), "kernel_a", base_flags, Path(tmp))
        build(SOURCE.read_text(), ours, "kernel_b", FLAGS, Path(tmp))
    print(
        f"A: {rel} at {args.base} ({' '.join(base_flags)}); B: the working tree "
        f"({' '.join(FLAGS)}); {torch.get_num_threads()} threads"
    )
    print("| dtype | rows x context | A ms | B ms | A/B (median) | rounds |")
    print("|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for rows, ctx in SIZES:
            batch = inputs(rows, ctx, dtype)
            a, b = attend("kernel_a", batch), attend("kernel_b", batch)
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
            calls = max(3, 20_000 // (rows * ctx))
            flush = torch.ones(16 * 1024 * 1024) if args.cold else None
            times: dict[str, list[float]] = {"kernel_a": [], "kernel_b": []}
            for r in range(args.rounds):
                for name in ("kernel_a", "kernel_b") if r % 2 == 0 else ("kernel_b", "kernel_a"):
                    times[name].append(timed(name, batch, calls, flush) * 1e3)
            ratios = [x / y for x, y in zip(times["kernel_a"], times["kernel_b"], strict=True)]
            print(
                f"| {str(dtype).removeprefix('torch.')} | {rows} x {ctx} | "
                f"{statistics.median(times['kernel_a']):.3f} | "
                f"{statistics.median(times['kernel_b']):.3f} | "
                f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
