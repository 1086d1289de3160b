"""The C++ decode-attention kernel (framework/executors/kernels/) against the portable gather + SDPA
path it replaces on CPU fp32, and the engine's greedy text with it on and off."""

from __future__ import annotations

import random
import shutil
import warnings

import pytest
import torch

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.kv_cache import ALIGN, KVCache
from framework.executors.kernels.paged_decode import available, why_not
from framework.executors.paged_attention import PagedBatch, _decode
from tests.helpers import check_same_greedy, hf_greedy, make_cfg, run_engine

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    reason = why_not(CPU, torch.float32, 64)
    if reason is not None and shutil.which("c++") is None:
        pytest.skip(f"no C++ compiler here: {reason}")  # the engine falls back, as tested below
    assert reason is None, reason


def paged_batch(cache: KVCache, lens: list[int], rng: random.Random, kernel: bool) -> PagedBatch:
    """Decode rows with the given context lengths, each on blocks drawn at random."""
    bs = cache.block_size
    free = list(range(cache.num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // bs))] for n in lens]
    width = max(len(t) for t in tables)
    blocks = torch.zeros(len(lens), width, dtype=torch.long)
    for i, t in enumerate(tables):
        blocks[i, : len(t)] = torch.tensor(t)
    lengths = torch.tensor(lens).view(-1, 1, 1, 1)
    return PagedBatch(
        cache=cache,
        slot_mapping=torch.empty(0, dtype=torch.long),
        decode_q_idx=torch.arange(len(lens)),
        decode_blocks=blocks,
        decode_lens=lengths,
        decode_mask=torch.arange(width * bs).view(1, 1, 1, -1) < lengths,
        prefills=[],
        decode_kernel=kernel,
    )


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "dim", "block_size", "window"),
    [
        (9, 3, 64, 16, None),
        (4, 4, 16, 4, None),
        (8, 2, 32, 8, 5),
        (4, 1, 128, 16, 40),
        (6, 2, 24, 8, None),  # a head size the kernel has no register layout for
        (4, 2, 48, 6, 7),  # two heads a kv head; blocks not a multiple of four positions
    ],
)
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_gather_and_sdpa(
    q_heads: int,
    kv_heads: int,
    dim: int,
    block_size: int,
    window: int | None,
    rows: int,
    dtype: torch.dtype,
) -> None:
    """In bf16 the kernel widens the cache to fp32 as it reads and computes in fp32: the
    reference is gather + SDPA in fp32 over the very same (bf16-rounded) values, so the only
    difference left is the output's one rounding to bf16."""
    rng = random.Random(rows * 1000 + dim)
    torch.manual_seed(rows + dim)
    lens = [rng.randint(1, 70) for _ in range(rows)]
    need = sum(-(-n // block_size) for n in lens)
    cache = KVCache(1, need + 3, block_size, kv_heads, dim, dtype, CPU)
    cache.k[0].normal_()
    cache.v[0].normal_()
    q = torch.randn(rows, q_heads, 1, dim).to(dtype)
    state = rng.getstate()
    k32, v32 = cache.k[0].float(), cache.v[0].float()
    ref = _decode(q.float(), k32, v32, paged_batch(cache, lens, rng, False), None, window)
    rng.setstate(state)  # the same block tables
    got = _decode(q, cache.k[0], cache.v[0], paged_batch(cache, lens, rng, True), None, window)
    assert got.shape == ref.shape == (rows, q_heads, dim) and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)
    else:  # exactly ref rounded to bf16, up to fp32 summation order
        torch.testing.assert_close(got, ref.to(dtype), atol=1e-2, rtol=8e-3)


def test_engine_text_is_the_same_with_and_without_the_kernel(tiny) -> None:
    model, tok = tiny
    rng = random.Random(7)
    specs = [
        RequestSpec(
            f"r{i}",
            [rng.randrange(3, len(tok)) for _ in range(rng.randint(1, 40))],
            SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True),
        )
        for i in range(6)
    ]
    runs = {}
    for on in (True, False):
        cfg = make_cfg("scheduler=continuous", "allocator=incremental", f"engine.paged_kernel={on}")
        result = run_engine(cfg, model, tok, specs)
        runs[on] = {s.id: list(s.output_token_ids) for s in result.seqs}
    for s in specs:
        ref = hf_greedy(model, s.prompt_token_ids, s.sampling.max_tokens, None)
        for on in (True, False):
            check_same_greedy(model, s.prompt_token_ids, s.id, runs[on][s.id], ref)


def test_it_says_why_it_is_not_used() -> None:
    assert "CPU in float32 or bfloat16" in (why_not(torch.device("cuda"), torch.float32, 64) or "")
    assert "CPU in float32 or bfloat16" in (why_not(CPU, torch.float16, 64) or "")
    assert why_not(CPU, torch.bfloat16, 64) is None
    assert "head size 12" in (why_not(CPU, torch.float32, 12) or "")
    with pytest.warns(UserWarning, match="engine.paged_kernel: using gather"):
        assert not available(CPU, torch.float32, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # other devices and dtypes: the portable path, silently
        assert not available(CPU, torch.float16, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_pool_is_zero_page_aligned_and_its_layers_apart(dtype: torch.dtype) -> None:
    """The pool's layers are views of one lazily zeroed block: each reads as zeros, starts
    on a page whatever its size, and a write to one touches no other."""
    cache = KVCache(3, 5, 4, 3, 7, dtype, CPU)  # a layer of 6 x 4 slots x 3 x 7: 1 KB, odd
    layers = [*cache.k, *cache.v]
    assert all(t.shape == (24, 3, 7) and t.dtype == dtype and t.is_contiguous() for t in layers)
    assert all(t.data_ptr() % ALIGN == 0 for t in layers)
    assert all(not t.any() for t in layers)
    cache.k[1].fill_(1)
    assert [bool(t.any()) for t in layers] == [False, True, False, False, False, False]
