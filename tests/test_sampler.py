"""The sampler: its noise is the documented hash (checked against a pure-Python splitmix64),
its draws follow softmax (Gumbel-max), its top-k and top-p masks keep what a row-by-row
filter keeps, a row's draw depends on its own (seed, index) alone, and it reads nothing back
to the host."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from framework.core.request import SamplingParams
from framework.engine.batch import Row
from framework.executors.sampler import draw_seed, filter_logits, gumbel, sample, uniforms
from framework.executors.sync_watch import SyncWatch

MASK = (1 << 64) - 1


def splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


@given(seed=st.integers(0, 2**63 - 2), first=st.integers(0, 60000))
@settings(max_examples=50, deadline=None)
def test_the_noise_is_the_documented_hash(seed: int, first: int) -> None:
    got = uniforms(torch.tensor([seed]), first + 4)[0, first:]
    for j, u in zip(range(first, first + 4), got.tolist(), strict=True):
        assert u == ((splitmix(splitmix(seed) ^ j) >> 11) + 0.5) * 2.0**-53


def test_draws_follow_the_softmax() -> None:
    """20,000 draw seeds over five logits: each token's share within 1.5 points of its
    probability (the seeds are fixed, so this is a fixed check, not a flaky one)."""
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0], dtype=torch.float64)
    seeds = torch.tensor([draw_seed(s, 0) for s in range(20000)])
    chosen = torch.argmax(logits[None, :] + gumbel(seeds, 5), dim=-1)
    share = torch.bincount(chosen, minlength=5) / len(seeds)
    assert torch.allclose(share, torch.softmax(logits, 0).to(share.dtype), atol=0.015)


def filter_one(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row filtered the plain way: values below the k-th largest out, then the tokens
    after the nucleus's mass reaches top_p (the first always stays)."""
    if 0 < top_k < logits.numel():
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


@given(
    rows=st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from([1.0, 0.9, 0.5, 0.1]), st.integers(0, 99)),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=40, deadline=None)
def test_the_masks_keep_what_a_row_by_row_filter_keeps(rows: list[tuple[int, float, int]]) -> None:
    logits = torch.stack(
        [torch.randn(32, generator=torch.Generator().manual_seed(s)) for *_, s in rows]
    )
    logits[:, 5] = logits[:, 6]  # a tie
    got = filter_logits(
        logits, torch.tensor([k for k, _, _ in rows]), torch.tensor([p for _, p, _ in rows])
    )
    for i, (k, p, _) in enumerate(rows):
        assert torch.equal(torch.isinf(got[i]), torch.isinf(filter_one(logits[i], k, p))), (k, p)


def test_a_filter_that_cuts_nothing_keeps_every_logit() -> None:
    """`sample` skips the filter when no row cuts (top_k 0, top_p 1, no min_p): exact only
    because the filter then returns the logits bit for bit, ties and -inf included."""
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    logits[:, 5] = logits[:, 6]
    logits[1, 9] = float("-inf")
    got = filter_logits(logits, torch.zeros(3, dtype=torch.long), torch.ones(3))
    assert torch.equal(got, logits)


def rows_of(params: list[SamplingParams], index: list[int]) -> list[Row]:
    return [
        Row(f"r{i}", [1], 4, [4], [0], n, sp, 0)
        for i, (sp, n) in enumerate(zip(params, index, strict=True))
    ]


def test_a_rows_draw_is_its_own_whatever_the_batch() -> None:
    vocab = 300
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.8, seed=11),
        SamplingParams(),  # greedy
        SamplingParams(temperature=1.2, top_k=20, top_p=0.9, seed=5),
        SamplingParams(temperature=0.5, top_p=0.5, seed=11),
    ]
    together = sample(logits, rows_of(params, [3, 0, 7, 3]))
    for i in range(4):
        alone = sample(logits[i : i + 1], rows_of([params[i]], [[3, 0, 7, 3][i]]))
        assert int(alone[0]) == int(together[i])
    assert int(together[1]) == int(torch.argmax(logits[1]))
    again = sample(logits, rows_of(params, [3, 0, 8, 3]))  # another token index: another draw
    assert torch.equal(again[[0, 1, 3]], together[[0, 1, 3]])


def test_sampling_reads_nothing_back() -> None:
    logits = torch.randn(3, 500)
    params = [SamplingParams(temperature=0.7, top_k=50, top_p=0.8, seed=i) for i in range(3)]
    with SyncWatch() as syncs:
        sample(logits, rows_of(params, [0, 1, 2]))
    assert syncs.calls == [], syncs.calls
