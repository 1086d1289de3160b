"""Whether any request of a workload could ever run on an engine's limits: checked up front,
before the model loads where the pool is known, so a run that would reject everything stops
with the limits in the way named."""

from __future__ import annotations

from collections.abc import Sequence


def check_fits(
    sizes: Sequence[int],
    *,
    num_blocks: int | None,
    block_size: int,
    max_model_len: int | None,
    max_num_batched_tokens: int | None,
    pool_source: str = "",
) -> None:
    """Fail up front when no request of the workload could ever run here.

    `sizes` are the requests' prompt + max_tokens. A request that alone exceeds the
    model's context, the pool or the token budget is rejected by the engine with its reason
    while the rest run; when that would be every request, the run is pointless, so it stops
    here naming each limit in the way and what the largest request needs. A limit not known
    yet (None: the pool before the model is loaded) is not checked, nor is the token budget
    where the scheduler chunks prefills (None). `pool_source` says
    where the pool size came from (`engine.num_blocks=...` or `engine.kv_memory_mb=...`).
    """
    if not sizes:
        return
    small, large = min(sizes), max(sizes)

    def blocks(n: int) -> int:
        return -(-n // block_size)

    limits: list[str] = []
    if num_blocks is not None and blocks(small) > num_blocks:
        limits.append(
            f"the KV pool holds {num_blocks} blocks of {block_size} tokens ({pool_source}); "
            f"the largest request needs {blocks(large)} blocks, the smallest {blocks(small)}: "
            f"set engine.num_blocks >= {blocks(large)}"
        )
    if max_model_len is not None and small > max_model_len:
        limits.append(
            f"the model's context is {max_model_len} tokens (model.max_model_len, or the "
            f"model's max_position_embeddings): lower the prompt lengths or max_tokens"
        )
    if max_num_batched_tokens is not None and small > max_num_batched_tokens:
        limits.append(
            f"engine.max_num_batched_tokens = {max_num_batched_tokens} (a request, or a "
            f"preempted one, is prefilled whole): set it >= {large}"
        )
    if limits:
        raise ValueError(
            f"no request of this workload can ever run here: prompt + max_tokens is {small} "
            f"tokens for the smallest and {large} for the largest, and " + "; and ".join(limits)
        )
