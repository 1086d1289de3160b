"""Decode steps through static buffers, replayed as CUDA graphs (`engine.cuda_graphs`).

Why: launched from Python, a decode step of an 8B model is about 1,350 kernels, each paying
the host's dispatch; at small batches the GPU waits for the host. A CUDA graph records one
step's kernels once and replays them with one launch. A graph reads and writes fixed
addresses, so the step's inputs live in static buffers sized for a batch-size bucket (1, 2,
4, 8, then steps of 16 up to `max_num_seqs`, nano-vllm's and vLLM's scheme); a step of n
decode rows runs in the smallest bucket that holds it, its spare rows padding:

- a padded row reads and writes the pool's scratch block (its one position), never a live one;
- every row's block table is padded to the widest a request can have (`width`) with the
  scratch block, which no length ever reaches;
- the buffers are one int64 tensor on the device, filled from one pinned host tensor with
  one non-blocking copy (ids, positions, slots, lengths, tables), so a step sends its inputs
  in one transfer and never waits;
- an input token still on the device (deferred output) is written into the ids buffer there;
- everything derived from the inputs (the gather path's mask, flex_attention's block mask)
  is computed inside the captured forward, from the buffers, so a replay recomputes it.

The graph's output is the logits of the bucket's rows; the sampler runs outside it on a
fresh tensor, so a step held on the device by the output policy is never overwritten by the
next replay (which the stream orders after the sampler's reads).

Steps with a prefill row (whole or chunk) run eagerly, as do batches wider than the largest
bucket. On a CPU nothing is captured: the same runner runs the forward on the same static
buffers each step (`engine.cuda_graphs=true` there), which is how the padding, the buckets
and the held inputs are tested without a GPU.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import torch

from framework.engine.batch import HELD, StepBatch
from framework.executors.kernel_choice import Choice

WARMUP = 2  # eager runs on a side stream before a capture: compiles, cuBLAS workspaces


def buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes with a graph: 1, 2, 4, 8, then steps of 16, up to and including
    `max_num_seqs` (the last bucket is `max_num_seqs` itself, so no step is ever padded past
    what the engine can batch)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += range(16, max_num_seqs, 16)
    return [*sizes, max_num_seqs]


def graphs_setting(value: object) -> bool | None:
    """`engine.cuda_graphs` as True / False, None for auto; else one line naming the field."""
    text = str(value).strip().lower()
    if text not in ("auto", "true", "false"):
        raise ValueError(
            "engine.cuda_graphs must be auto (captured on CUDA, off elsewhere), true or false;"
            f" got {value!r}"
        )
    return None if text == "auto" else text == "true"


def choose_graphs(value: object, device: torch.device) -> Choice:
    """`engine.cuda_graphs`: auto captures on CUDA; elsewhere there is nothing to capture
    and the eager step is the same work without the copy into static buffers. `true` on a
    CPU runs the static-buffer runner uncaptured (what the tests check it with)."""
    want = graphs_setting(value)
    if want is False:
        return Choice(False, "set", "")
    if device.type == "cuda":
        return Choice(True, "set" if want else "default", "captured per batch bucket")
    if want:
        return Choice(True, "set", f"static buffers, nothing captured on {device.type}")
    return Choice(False, "default", f"nothing to capture on {device.type}")


@dataclass
class StaticInputs:
    """One bucket's input buffers: views of one int64 device tensor, so one copy fills them."""

    size: int  # rows
    width: int  # blocks in a row's table
    flat: torch.Tensor  # [size * (4 + width)]: ids, positions, slots, lengths, tables

    @property
    def ids(self) -> torch.Tensor:  # [1, size]
        return self.flat[: self.size].view(1, -1)

    @property
    def positions(self) -> torch.Tensor:  # [1, size]
        return self.flat[self.size : 2 * self.size].view(1, -1)

    @property
    def slots(self) -> torch.Tensor:  # [size]
        return self.flat[2 * self.size : 3 * self.size]

    @property
    def lens(self) -> torch.Tensor:  # [size, 1, 1, 1], as PagedBatch.decode_lens
        return self.flat[3 * self.size : 4 * self.size].view(-1, 1, 1, 1)

    @property
    def tables(self) -> torch.Tensor:  # [size, width]
        return self.flat[4 * self.size :].view(self.size, self.width)


# The model call on a bucket's buffers, returning that bucket's logits [size, vocab].
Forward = Callable[[StaticInputs], torch.Tensor]


@dataclass
class Bucket:
    inputs: StaticInputs
    graph: torch.cuda.CUDAGraph | None = None  # None: the forward runs eagerly on the buffers
    logits: torch.Tensor | None = None  # the graph's output buffer


class DecodeGraphs:
    """A decode step's forward through the smallest bucket that holds it: replayed from a
    CUDA graph on CUDA, run on the same static buffers elsewhere."""

    def __init__(
        self,
        forward: Forward,
        sizes: list[int],
        width: int,
        block_size: int,
        scratch_block: int,
        device: torch.device,
    ) -> None:
        self.forward = forward
        self.sizes = sizes
        self.width = width
        self.block_size = block_size
        self.scratch = scratch_block
        self.device = device
        self.capture = device.type == "cuda"
        self.buckets = {
            n: Bucket(
                StaticInputs(
                    n, width, torch.zeros(n * (4 + width), dtype=torch.long, device=device)
                )
            )
            for n in sizes
        }
        for n in sizes:
            self._pad(self.buckets[n].inputs)  # every row padding: safe to run as captured
        if self.capture:
            self._capture_all()

    def _pad(self, static: StaticInputs) -> None:
        """Every row a padding row: id 0 at position 0, writing and reading the scratch
        block's first slot, its table all scratch."""
        host = self._host([], [], [], [], static.size)
        static.flat.copy_(host)

    def _capture_all(self) -> None:
        """One graph a bucket, largest first, sharing one memory pool (the largest bucket's
        activations hold every smaller one's), after warm-up runs on a side stream."""
        # A compiled function (flex_attention, the glue) compiles once per bucket's shape:
        # room for every bucket before dynamo gives up and runs it eagerly.
        from torch._dynamo import config as dynamo

        dynamo.cache_size_limit = max(dynamo.cache_size_limit, 2 * len(self.sizes) + 8)
        pool = torch.cuda.graph_pool_handle()
        main = torch.cuda.current_stream(self.device)
        for n in sorted(self.sizes, reverse=True):
            bucket = self.buckets[n]
            side = torch.cuda.Stream(self.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    self.forward(bucket.inputs)
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                bucket.logits = self.forward(bucket.inputs)
            bucket.graph = graph

    def fits(self, batch: StepBatch) -> bool:
        """Whether a bucket serves the step: decode rows alone, no more than the largest."""
        rows = batch.rows
        if len(rows) > self.sizes[-1]:
            return False
        return all(len(r.token_ids) == 1 and r.start_pos > 0 for r in rows)

    def stage(self, batch: StepBatch) -> tuple[Bucket, int]:
        """The step's inputs into the smallest bucket that holds it (host work and one
        non-blocking copy); returns the bucket and the step's rows."""
        rows = batch.rows
        n = len(rows)
        bucket = self.buckets[self.sizes[bisect_left(self.sizes, n)]]
        static = bucket.inputs
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        lens: list[int] = []
        tables: list[int] = []
        held: list[int] = []  # rows whose input token is still on the device
        width = self.width
        pad = [self.scratch] * width
        for i, row in enumerate(rows):
            token = row.token_ids[0]
            if token == HELD:
                held.append(i)
                token = 0
            ids.append(token)
            pos.append(row.start_pos)
            slots.append(row.slots[0])
            lens.append(row.ctx_len)
            table = row.block_table[: -(-row.ctx_len // bs)]
            tables += table
            tables += pad[: width - len(table)]
        host = self._host(ids, pos, slots, lens, static.size, tables)
        if self.device.type == "cuda":
            static.flat.copy_(host.pin_memory(), non_blocking=True)
        else:
            static.flat.copy_(host)
        if held:
            src = batch.device_inputs.reshape(-1).to(torch.long)
            if len(held) == n:
                static.ids[0, :n].copy_(src)
            else:
                at = torch.frombuffer(array("q", held), dtype=torch.long)
                if self.device.type == "cuda":
                    at = at.pin_memory().to(self.device, non_blocking=True)
                static.ids[0].index_copy_(0, at, src.index_select(0, at))
        return bucket, n

    def launch(self, bucket: Bucket, n: int) -> torch.Tensor:
        """The staged step's logits, [n, vocab]: the bucket's graph replayed (or its forward
        run on the buffers), the real rows' logits returned (a view of the graph's output
        buffer, read by the sampler before the next replay writes it)."""
        if bucket.graph is not None:
            bucket.graph.replay()
            assert bucket.logits is not None
            return bucket.logits[:n]
        return self.forward(bucket.inputs)[:n]

    def _host(
        self,
        ids: list[int],
        pos: list[int],
        slots: list[int],
        lens: list[int],
        size: int,
        tables: list[int] | None = None,
    ) -> torch.Tensor:
        """The bucket's buffers as one host int64 tensor: the rows given, then padding rows
        (id 0, position 0, the scratch block's first slot, length 1, an all-scratch table)."""
        spare = size - len(ids)
        scratch_slot = self.scratch * self.block_size
        flat = array("q", ids)
        flat.extend([0] * spare)
        flat.extend(pos)
        flat.extend([0] * spare)
        flat.extend(slots)
        flat.extend([scratch_slot] * spare)
        flat.extend(lens)
        flat.extend([1] * spare)
        if tables:
            flat.extend(tables)
        flat.extend([self.scratch] * (self.width * spare))
        return torch.frombuffer(flat, dtype=torch.long)
