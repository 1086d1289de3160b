"""Paged attention through PyTorch's `flex_attention`: every query reads its own row's KV
blocks where they lie in the cache, through a block mask built from the block tables.

Why: the portable decode path gathers each row's blocks into a padded copy before SDPA (the
KV read twice and written once), and prefill rows run one SDPA per row per layer from a
Python loop. Here the cache is one long sequence, `[1, Hkv, slots, D]` (a view, no copy),
and PyTorch's paged design (torch/nn/attention/experimental/_paged_attention.py) turns a
row's logical mask into a physical one:

- the block mask lists, for each tile of queries, the physical blocks its rows own (a
  compiled kernel visits only those; the list is as wide as the pool, as PyTorch's is);
- its `mask_mod` maps a physical slot back to the row's logical position through an inverse
  page table (`p2l[row, block]`, -1 where the block is not the row's), then applies the
  row's length, causality and a sliding window. Blocks shared by several rows (prefix
  caching) appear in each row's map.

Decode rows are one call: a batch of rows with one query each (the flex decoding kernel on
CUDA). Prefill rows are one call too: their queries packed as one sequence with each
query's row and position (a document mask), every row's keys read from the cache, which
holds this step's K/V before attention runs; so a row over cached context
(`PrefillRow.ctx_slots` on the other path) and a fresh one are the same case.

On CUDA `flex_attention` is compiled (Triton, block sparse): the intended path there. On
CPU it runs eagerly, a dense reference that scores each query against every slot of the
pool; correct, and far slower than the C++ kernel or SDPA on a real pool, so it is not a
CPU default (`kernel_choice.choose_flex`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # imported where first used: a run without flex_attention never loads it
    from torch.nn.attention.flex_attention import BlockMask

Q_TILE = 128  # queries per block-mask tile: flex's default, a multiple of its kernels' tiles


@functools.cache
def why_not_compiled(device: torch.device) -> str | None:
    """Why `flex_attention` would not be compiled here (None: it is, as on CUDA with Triton)."""
    if device.type != "cuda":
        return f"on {device.type} flex_attention runs eager, dense over the whole KV pool"
    from torch.utils._triton import has_triton

    return None if has_triton() else "no Triton to compile flex_attention for CUDA"


def _flex() -> Any:
    from torch.nn.attention import flex_attention as flex

    return flex


@functools.cache
def _compiled() -> Callable[..., Any]:
    """One compiled `flex_attention` per process: each new shape compiles once, then replays."""
    return torch.compile(_flex().flex_attention, fullgraph=True)


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    mask: BlockMask,
    scale: float | None,
) -> torch.Tensor:
    """`q` [B, Hq, L, D] over one layer's whole cache seen as `[1, Hkv, slots, D]`."""
    k = k_cache.unsqueeze(0).transpose(1, 2)
    v = v_cache.unsqueeze(0).transpose(1, 2)
    if why_not_compiled(q.device):
        return _flex().flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
    # The kernel's key tile must divide a KV block: nanoserve's blocks (16) are smaller than
    # flex's default tiles (64, 128).
    tile = {"BLOCK_N": min(mask.BLOCK_SIZE[1] & -mask.BLOCK_SIZE[1], 64)}
    return _compiled()(q, k, v, block_mask=mask, scale=scale, enable_gqa=True, kernel_options=tile)


def why_not_block_size(block_size: int) -> str | None:
    """Why the compiled kernel cannot take these KV blocks (None: it can): Triton's matrix
    products need tiles of 16 keys or more, and a tile must divide a block."""
    if block_size % 16:
        return f"block size {block_size} is not a multiple of 16 (the compiled kernel's key tile)"
    return None


def _inverse_table(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    return torch.full((rows, cols + 1), -1, dtype=torch.long, device=device)


def _wide(compact: torch.Tensor, cols: int) -> torch.Tensor:
    """Block indices `[..., n]` padded to the pool's width (int32), as flex's kernels read them."""
    wide = torch.zeros(*compact.shape[:-1], cols, dtype=torch.int32, device=compact.device)
    wide[..., : compact.shape[-1]] = compact
    return wide


def _block_mask(
    num: torch.Tensor,  # [B, tiles] blocks listed for each tile of queries
    listed: torch.Tensor,  # [B, tiles, n] those blocks
    tile: int,
    block_size: int,
    q_len: int,
    cols: int,
    mask_mod: Callable[..., Any],
) -> BlockMask:
    """Every listed block partial (`mask_mod` decides each slot), the list as wide as the
    pool; an empty list of full blocks, which Inductor's CPU kernel expects to find."""
    b, n = num.shape
    wide = _wide(listed.view(b, 1, n, -1), cols)
    return _flex().BlockMask.from_kv_blocks(
        num.to(torch.int32).view(b, 1, n),
        wide,
        torch.zeros_like(num, dtype=torch.int32).view(b, 1, n),
        torch.zeros_like(wide),
        BLOCK_SIZE=(tile, block_size),
        mask_mod=mask_mod,
        seq_lengths=(q_len, cols * block_size),
        compute_q_blocks=False,
    )


@dataclass
class FlexDecode:
    """One step's decode rows for `flex_attention`: made once, read by every layer."""

    blocks: torch.Tensor  # [Bd, nb] each row's block table, padded
    lens: torch.Tensor  # [Bd] positions each row attends to
    num: torch.Tensor  # [Bd] blocks each row owns
    p2l: torch.Tensor  # [Bd, cols] logical block of each physical block in the row, or -1
    block_size: int
    cols: int  # blocks in the pool, scratch included
    masks: dict[int | None, BlockMask] = field(default_factory=dict)  # by sliding window

    def mask(self, window: int | None) -> BlockMask:
        """The rows' block mask (on a sliding layer only the blocks in the window listed)."""
        if window in self.masks:
            return self.masks[window]
        bd, nb = self.blocks.shape
        p2l, lens, bs = self.p2l, self.lens, self.block_size
        blocks, num = self.blocks, self.num
        if window:  # the first block a row's query still sees, to the front of its list
            first = (lens - window).clamp(min=0) // bs
            at = (torch.arange(nb, device=blocks.device) + first[:, None]).clamp(max=nb - 1)
            blocks, num = blocks.gather(1, at), num - first

        def visible(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            logical = p2l[b, kv_idx // bs]
            pos = logical * bs + kv_idx % bs
            keep = (logical >= 0) & (pos < lens[b])
            return keep & (pos > lens[b] - 1 - window) if window else keep

        mask = _block_mask(
            num.view(bd, 1), blocks.view(bd, 1, nb), Q_TILE, bs, 1, self.cols, visible
        )
        self.masks[window] = mask
        return mask


def decode_plan(blocks: torch.Tensor, lens: torch.Tensor, block_size: int, cols: int) -> FlexDecode:
    """From the decode rows' padded block tables and lengths (on the device): built there, so
    nothing waits for the host."""
    lens = lens.view(-1)
    bd, nb = blocks.shape
    num = (lens + block_size - 1) // block_size
    idx = torch.arange(nb, device=blocks.device).expand(bd, nb)
    owned = torch.where(idx < num[:, None], blocks, cols)  # padding to a dropped column
    p2l = _inverse_table(bd, cols, blocks.device).scatter_(1, owned, idx)[:, :cols]
    return FlexDecode(blocks, lens, num, p2l, block_size, cols)


def flex_decode(
    qd: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: FlexDecode,
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """[Bd, Hq, D]: each decode row's query ([Bd, Hq, 1, D]) over its own blocks."""
    return _attend(qd, k_cache, v_cache, plan.mask(window), scale).squeeze(2)


@dataclass
class FlexPrefill:
    """One step's prefill rows for `flex_attention`, packed: made once, read by every layer."""

    q_index: torch.Tensor | None  # [Tp] packed index of each prefill query; None: all are
    row: torch.Tensor  # [Tp] which prefill row each query belongs to
    pos: torch.Tensor  # [Tp] each query's position in its sequence
    p2l: torch.Tensor  # [R, cols] as FlexDecode's
    num: torch.Tensor  # [tiles] blocks listed for each tile of `tile` queries
    tiles: torch.Tensor  # [tiles, width] those blocks
    block_size: int
    cols: int
    tile: int  # queries per tile of the block mask
    masks: dict[int | None, BlockMask] = field(default_factory=dict)

    def mask(self, window: int | None) -> BlockMask:
        """The packed rows' block mask: a query sees its own row's positions up to its own
        (the last `window` of them on a sliding layer)."""
        if window in self.masks:
            return self.masks[window]
        row, pos, p2l, bs = self.row, self.pos, self.p2l, self.block_size

        def visible(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            qp = pos[q_idx]
            logical = p2l[row[q_idx], kv_idx // bs]
            kp = logical * bs + kv_idx % bs
            keep = (logical >= 0) & (kp <= qp)
            return keep & (qp - kp < window) if window else keep

        n = self.tiles.shape[0]
        tiles = self.tiles.view(1, n, -1)
        mask = _block_mask(
            self.num.view(1, n), tiles, self.tile, bs, row.numel(), self.cols, visible
        )
        self.masks[window] = mask
        return mask


def prefill_plan(
    rows: list[tuple[int, int, int, list[int]]],
    mixed: bool,
    block_size: int,
    cols: int,
    send: Callable[[list[int]], torch.Tensor],
    tile: int | None = None,
) -> FlexPrefill:
    """From the prefill rows' host lists, (packed start, queries, first position, block
    table up to its context), as the step is prepared: every tensor made on the host and
    sent (`send`: a list of ints to an int64 tensor on the device). `mixed`: decode rows
    share the step, so the prefill queries are picked out of the packed ones. Each tile of
    `tile` queries lists its rows' blocks up to the last position its queries see, once each."""
    bs = block_size
    tile = tile or Q_TILE  # read here, so a test may set the module's
    q_index: list[int] = []
    row: list[int] = []
    pos: list[int] = []
    inverse: list[int] = []  # (row, physical block, logical block) triples, flat
    tiles: list[dict[int, None]] = []
    offset = 0
    for r, (start, q, first, table) in enumerate(rows):
        if mixed:
            q_index += range(start, start + q)
        row += [r] * q
        pos += range(first, first + q)
        for logical, block in enumerate(table):
            inverse += (r, block, logical)
        for t in range(offset // tile, (offset + q - 1) // tile + 1):
            while len(tiles) <= t:
                tiles.append({})
            last = first + min(offset + q, (t + 1) * tile) - 1 - offset  # its last query
            tiles[t].update(dict.fromkeys(table[: last // bs + 1]))
        offset += q
    width = max(map(len, tiles))
    flat: list[int] = []
    for listed in tiles:
        flat += listed
        flat += [0] * (width - len(listed))
    triples = send(inverse).view(-1, 3)
    p2l = _inverse_table(len(rows), cols, triples.device)
    p2l.index_put_((triples[:, 0], triples[:, 1]), triples[:, 2])
    return FlexPrefill(
        q_index=send(q_index) if mixed else None,
        row=send(row),
        pos=send(pos),
        p2l=p2l[:, :cols],
        num=send([len(listed) for listed in tiles]),
        tiles=send(flat).view(len(tiles), width),
        block_size=bs,
        cols=cols,
        tile=tile,
    )


def flex_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: FlexPrefill,
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """[Tp, Hq, D]: every prefill query of the step (`q`: [Hq, T, D], all the step's) over
    its own row's blocks, in one call."""
    qp = q if plan.q_index is None else q.index_select(1, plan.q_index)
    return _attend(qp.unsqueeze(0), k_cache, v_cache, plan.mask(window), scale)[0].transpose(0, 1)
