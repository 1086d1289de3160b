"""Published per-operator GPU tables (Vidur's format) read into arrays, and the cost model's
prediction of every row: what `gpu_fit` fits and `experiments.gpu_check` judges.

An operator table has one row per (token count, tensor-parallel degree) of one model shape:
`time_stats.<op>.median` in milliseconds for the operators of one layer, then `n_head`,
`n_kv_head`, `n_embd`, `n_expanded_embd`, `vocab_size`, `use_gated_mlp`, `num_tokens` and
`num_tensor_parallel_workers`. A collective table has `time_stats.all_reduce.median`,
`num_workers`, `size` and `collective`. Its `size` is in bytes: Vidur's profiler writes
`size * 2  # bytes` of an fp16 buffer of `size` elements, and its predictor reads the column
back as bytes. Where the table has `devices_per_node`, only the rows measured within one node
(`devices_per_node == num_workers`) are read, as Vidur's own predictor does: its other rows
span nodes (a DGX table's 2 workers on 2 nodes, 1 a node) and time the network between them.

An attention table (Vidur's `attention.csv`) has `time_stats.attn_prefill.median` for its
prefill rows (`is_prefill`, one sequence: `batch_size` 1) of `prefill_chunk_size` queries over
`kv_cache_size` keys already cached, with `n_q_head`, `n_kv_head`, `n_embd` and
`num_tensor_parallel_workers`; its decode rows are not read. Its `attn_prefill` is the
attention kernel alone: the KV write (`attn_kv_cache_save`) and the reshapes are columns of
their own.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from framework.executors.simulated.analytic import CAUSAL_FRACTION
from framework.executors.simulated.gpu.kernels import (
    AllReduceFit,
    AttentionFit,
    KernelFits,
    PrefillAttentionFit,
)
from framework.executors.simulated.gpu.shard import (
    TABLE_OPERATORS,
    Device,
    Shard,
    layer_operators,
)

SHAPE_COLUMNS = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)
COLLECTIVE_COLUMNS = ("time_stats.all_reduce.median", "num_workers", "size", "collective")
ATTENTION_COLUMNS = (
    "time_stats.attn_prefill.median",
    "n_q_head",
    "n_kv_head",
    "n_embd",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
)
TABLE_DTYPE_BYTES = 2  # the published tables are fp16


class TableError(ValueError):
    """A file that is not a table of the expected format: one line, naming what is wrong."""


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TableError(f"{path}: not a readable CSV file ({exc})") from None
    if not rows:
        raise TableError(f"{path}: no rows")
    return header, rows


def _column(rows: list[dict[str, str]], name: str, path: Path) -> np.ndarray:
    out = np.empty(len(rows))
    for i, row in enumerate(rows):
        text = (row.get(name) or "").strip()
        try:
            out[i] = float(text == "True") if text in ("True", "False") else float(text)
        except ValueError:
            raise TableError(
                f"{path}, row {i + 2}: column {name} is {text!r}, not a number"
            ) from None
    if not np.all(np.isfinite(out)):
        raise TableError(f"{path}: column {name} holds a value that is not finite")
    return out


@dataclass
class OperatorTable:
    path: Path
    operators: tuple[str, ...]  # the table's operators, in TABLE_OPERATORS order
    seconds: dict[str, np.ndarray]  # measured median per operator
    shape: dict[str, np.ndarray]  # SHAPE_COLUMNS

    @property
    def tokens(self) -> np.ndarray:
        return self.shape["num_tokens"]

    @property
    def tp(self) -> np.ndarray:
        return self.shape["num_tensor_parallel_workers"]

    def layer(self) -> np.ndarray:
        """The measured layer: the sum of the table's operators."""
        return sum((self.seconds[op] for op in self.operators), np.zeros(len(self.tokens)))

    def shard(self, i: int) -> Shard:
        s = {k: v[i] for k, v in self.shape.items()}
        heads = int(s["n_head"])
        return Shard(
            hidden=int(s["n_embd"]),
            intermediate=int(s["n_expanded_embd"]),
            heads=heads,
            kv_heads=int(s["n_kv_head"]),
            head_dim=int(s["n_embd"]) // heads,
            vocab=int(s["vocab_size"]),
            gated=bool(s["use_gated_mlp"]),
            tp=int(s["num_tensor_parallel_workers"]),
        )


def read_operator_table(path: str | Path) -> OperatorTable:
    p = Path(path)
    header, rows = _rows(p)
    missing = [c for c in SHAPE_COLUMNS if c not in header]
    if missing:
        raise TableError(f"{p}: not an operator table (missing columns: {', '.join(missing)})")
    ops = tuple(op for op in TABLE_OPERATORS if f"time_stats.{op}.median" in header)
    if not ops:
        raise TableError(
            f"{p}: no operator columns (time_stats.OP.median for OP in "
            f"{', '.join(TABLE_OPERATORS)})"
        )
    shape = {c: _column(rows, c, p) for c in SHAPE_COLUMNS}
    if np.any(shape["num_tokens"] < 1) or np.any(shape["num_tensor_parallel_workers"] < 1):
        raise TableError(f"{p}: num_tokens and num_tensor_parallel_workers must be >= 1")
    seconds = {op: _column(rows, f"time_stats.{op}.median", p) * 1e-3 for op in ops}
    if any(np.any(v <= 0) for v in seconds.values()):
        raise TableError(f"{p}: an operator time is not > 0")
    table = OperatorTable(p, ops, seconds, shape)
    for i in range(len(rows)):
        try:
            table.shard(i)
        except ValueError as exc:
            raise TableError(f"{p}, row {i + 2}: {exc}") from None
    return table


def predict_operators(
    table: OperatorTable, fits: KernelFits, device: Device
) -> dict[str, np.ndarray]:
    """The model's seconds for every row and operator of the table."""
    out = {op: np.empty(len(table.tokens)) for op in table.operators}
    for i in range(len(table.tokens)):
        ops = layer_operators(table.shard(i), int(table.tokens[i]), fits, device)
        for op in table.operators:
            out[op][i] = ops[op]
    return out


@dataclass
class CollectiveTable:
    path: Path
    workers: np.ndarray
    nbytes: np.ndarray
    seconds: np.ndarray


def read_collective_table(path: str | Path) -> CollectiveTable:
    p = Path(path)
    header, rows = _rows(p)
    missing = [c for c in COLLECTIVE_COLUMNS if c not in header]
    if missing:
        raise TableError(f"{p}: not a collective table (missing columns: {', '.join(missing)})")
    kinds = {(r.get("collective") or "").strip() for r in rows}
    if kinds != {"all_reduce"}:
        raise TableError(f"{p}: collective must be all_reduce in every row; found {sorted(kinds)}")
    workers = _column(rows, "num_workers", p)
    size = _column(rows, "size", p)
    seconds = _column(rows, "time_stats.all_reduce.median", p) * 1e-3
    if np.any(workers < 2) or np.any(size <= 0) or np.any(seconds <= 0):
        raise TableError(f"{p}: num_workers must be >= 2, size and times > 0")
    keep = np.ones(len(rows), dtype=bool)
    if "devices_per_node" in header:
        keep = _column(rows, "devices_per_node", p) == workers
        if not keep.any():
            raise TableError(
                f"{p}: no row measured within one node (devices_per_node == num_workers)"
            )
    return CollectiveTable(p, workers[keep].astype(int), size[keep], seconds[keep])


def predict_collective(table: CollectiveTable, fit: AllReduceFit) -> np.ndarray:
    return np.array(
        [fit.seconds(b, int(n)) for b, n in zip(table.nbytes, table.workers, strict=True)]
    )


def error_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """|predicted / measured - 1| summarised: fractions, not percentages."""
    e = np.abs(predicted / measured - 1)
    return {
        "mape": float(e.mean()),
        "median": float(np.median(e)),
        "p90": float(np.quantile(e, 0.9)),
        "max": float(e.max()),
        "rows": len(e),
    }


@dataclass
class AttentionTable:
    """The prefill rows of a published attention table: one sequence each, `queries` new
    tokens over `cached` keys already in the KV cache, on one of `tp` GPUs."""

    path: Path
    queries: np.ndarray
    cached: np.ndarray
    tp: np.ndarray
    heads: np.ndarray  # the whole model's query heads
    head_dim: np.ndarray
    seconds: np.ndarray  # attn_prefill, measured median

    @property
    def context(self) -> np.ndarray:
        """The keys each row's last query attends: the cached ones and its own chunk."""
        return self.queries + self.cached

    @property
    def fresh(self) -> np.ndarray:
        """Rows of a whole prompt (nothing cached): the square the simulator prices exactly."""
        return self.cached == 0

    def flops(self) -> np.ndarray:
        """Each row's FLOPs as the simulator counts them: 4 x heads on one GPU x head dim x
        the causal half of queries x context (exact for a prompt; a chunk over a cached
        prefix computes up to twice this)."""
        heads_shard = self.heads // self.tp
        return 4 * heads_shard * self.head_dim * CAUSAL_FRACTION * self.queries * self.context


def read_attention_table(path: str | Path) -> AttentionTable:
    p = Path(path)
    header, rows = _rows(p)
    missing = [c for c in ATTENTION_COLUMNS if c not in header]
    if missing:
        raise TableError(f"{p}: not an attention table (missing columns: {', '.join(missing)})")
    # Only the prefill rows are parsed: a decode row leaves the prefill times blank.
    keep = (_column(rows, "is_prefill", p) == 1) & (_column(rows, "batch_size", p) == 1)
    if not keep.any():
        raise TableError(f"{p}: no prefill row of one sequence (is_prefill True, batch_size 1)")
    rows = [row for row, k in zip(rows, keep, strict=True) if k]
    col = {c: _column(rows, c, p) for c in ATTENTION_COLUMNS}
    heads, tp = col["n_q_head"], col["num_tensor_parallel_workers"]
    if np.any(heads < 1) or np.any(tp < 1) or np.any(heads % tp) or np.any(col["n_embd"] % heads):
        raise TableError(f"{p}: n_q_head must divide n_embd and be divided by the TP degree")
    seconds = col["time_stats.attn_prefill.median"] * 1e-3
    if np.any(seconds <= 0) or np.any(col["prefill_chunk_size"] < 1):
        raise TableError(f"{p}: a prefill row with no queries or a time that is not > 0")
    return AttentionTable(
        p,
        queries=col["prefill_chunk_size"],
        cached=col["kv_cache_size"],
        tp=tp,
        heads=heads,
        head_dim=col["n_embd"] // heads,
        seconds=seconds,
    )


def predict_prefill_attention(
    table: AttentionTable, attention: AttentionFit, fit: PrefillAttentionFit | None, peak: float
) -> np.ndarray:
    """The simulator's seconds for every prefill row (one kernel, one layer), priced by
    `AttentionFit.prefill_seconds` as a step of that one row is."""
    flops, context = table.flops(), table.context
    return np.array(
        [attention.prefill_seconds(f, c, peak, fit) for f, c in zip(flops, context, strict=True)]
    )
