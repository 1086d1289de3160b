"""Shared test machinery: compose configs as the CLI does, build engines over a loaded model,
and compare greedy output against Hugging Face `generate` with the tie rule."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from framework.core.request import RequestSpec, SamplingParams
from framework.engine.loop import RunResult
from framework.executors.layer_glue import eager_glue
from framework.plugin_host.registry import registry
from framework.run.app import build_engine
from framework.run.config import register_configs
from framework.run.greedy_check import Divergence, compare_greedy

ROOT = Path(__file__).resolve().parents[1]

register_configs()


# A small simulated workload on the tiny model's shape: a capacity search's probes in
# a fraction of a second each.
SMALL = [
    "executor=simulated",
    "model=tiny",
    "workload=synthetic",
    "workload.num_requests=40",
    "workload.prompt_len_max=128",
    "workload.output_len_max=32",
]


# The policies that change how a request's tokens are computed (deferred output, chunks, a
# prefix cache, preemption by recompute and by swap), on the tiny model with 4-token blocks:
# what a feature that reads the logits must give the same answer under.
COMPUTE_POLICIES: dict[str, tuple[str, ...]] = {
    "default": (),
    "deferred": ("output=deferred", "window=4"),
    "chunked": ("scheduler=chunked", "engine.max_num_batched_tokens=8", "engine.max_num_seqs=4"),
    "prefix_cache": ("allocator=prefix_cache",),
    "preempted": ("allocator=incremental", "engine.num_blocks=20"),
    "swapped": ("allocator=incremental", "engine.num_blocks=20",
                "engine.host_kv_memory_mb=1", "preemption.mode=swap"),
}  # fmt: skip


def make_cfg(*overrides: str) -> DictConfig:
    """The run config of `overrides`, as Hydra composes it; a copy of its own each call, so a
    test may change it. Composed once per distinct overrides in a process: Hydra takes about
    0.3 s of CPU a compose on the 2-core VMs, a copy 6 ms, and the suite composes hundreds."""
    return copy.deepcopy(_composed(overrides))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose(config_name="config", overrides=list(overrides))


def cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    """The command line run in this process, as `python run.py ARGS` would: (exit status,
    stdout, stderr). Much faster than a subprocess (no second import of torch)."""
    from framework.run.cli import main

    capsys.readouterr()  # drop what came before
    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


def assert_refused(status: int, err: str, expected: str) -> None:
    """A user error: exit status 2, one `error: ...` line naming the problem, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines and lines[-1].startswith("error: "), err[-3000:]
    assert expected in lines[-1], f"{expected!r} not in {lines[-1]!r}"
    assert len([line for line in lines if line.startswith("error: ")]) == 1


def run_engine(cfg: DictConfig, model: Any, tokenizer: Any, specs: list[RequestSpec]) -> RunResult:
    dtype = getattr(model, "dtype", torch.float32)  # the KV cache in the model's own dtype
    engine = build_engine(cfg, model, torch.device("cpu"), dtype, registry().pm.hook)
    return engine.run(specs, tokenizer.eos_token_id)


@contextmanager
def as_hugging_face(model: Any) -> Iterator[None]:
    """The model as Hugging Face runs it, the reference every policy must match: its sdpa
    attention and its own eager norms, rotary and MLP, whatever an engine fused on it;
    restored after."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with eager_glue(model), torch.inference_mode():
            yield
    finally:
        model.set_attn_implementation(previous)


def hf_greedy(model: Any, prompt_ids: list[int], max_new: int, eos: int | None) -> list[int]:
    """Batch-1 greedy decoding by Hugging Face (`as_hugging_face`)."""
    with as_hugging_face(model):
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )
    return out[0, len(prompt_ids) :].tolist()


class Shared:
    """Plain results (JSON) computed once per test session, whichever xdist worker asks first;
    the others wait for it and read them. Why: a real model's Hugging Face references take
    about 20 s of CPU, and every worker that runs a test of the file would make them again.
    The files live in the session's own base folder, so no run reads another run's."""

    def __init__(self, root: Path | None) -> None:
        self.root = root  # None: one process, nothing to share

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`'s value for `key` (anything JSON can write: what the value depends on)."""
        if self.root is None:
            return compute()
        name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]
        path = self.root / f"{name}.json"
        with FileLock(self.root / f"{name}.lock"):
            if path.exists():
                return json.loads(path.read_text())
            value = compute()
            path.write_text(json.dumps(value))
            return json.loads(path.read_text())  # the same types whoever computed it


def check_same_greedy(
    model: Any, prompt: list[int], rid: str, ours: list[int], ref: list[int]
) -> Divergence | None:
    """Ours must equal ref, except where they first differ at a genuine tie (then the
    Divergence is returned and printed). Any other difference fails. The rule itself is
    `framework.run.greedy_check.compare_greedy`, which the benchmark uses too."""
    result = compare_greedy(model, prompt, rid, ours, ref)
    assert result.equal, result.reason
    if result.divergence is not None:
        print(f"tie accepted: {result.divergence}")
    return result.divergence


def random_specs(
    tok: Any,
    n: int,
    seed: int,
    prompt: tuple[int, int] = (1, 40),
    output: tuple[int, int] = (1, 24),
) -> list[RequestSpec]:
    """`n` requests of random token ids, their prompt and output lengths drawn from the
    (inclusive) ranges, EOS ignored so that each runs to its length."""
    rng = random.Random(seed)
    return [
        RequestSpec(
            f"r{i}",
            [rng.randrange(3, len(tok)) for _ in range(rng.randint(*prompt))],
            SamplingParams(max_tokens=rng.randint(*output), ignore_eos=True),
        )
        for i in range(n)
    ]


def spec(
    i: int, prompt: list[int], max_tokens: int, arrival: float = 0.0, ignore_eos: bool = True
) -> RequestSpec:
    """Request `r{i}`: greedy, `max_tokens` new tokens (EOS ignored unless told)."""
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    return RequestSpec(f"r{i}", prompt, sampling, arrival=arrival)


def tokens(result: RunResult | Any) -> dict[str, list[int]]:
    """Each request's output token ids, by id."""
    return {s.id: list(s.output_token_ids) for s in result.seqs}


def draw_specs(data: Any, most: int, eos_drawn: bool = False) -> list[RequestSpec]:
    """From a hypothesis `st.data()`: 1 to `most` requests of 1-40 token ids (3-400), 1-12 new
    tokens, arriving within 10 ms; with `eos_drawn`, whether each ignores EOS is drawn too
    (without it some stop at their first token)."""
    import hypothesis.strategies as st

    n = data.draw(st.integers(1, most))
    return [
        spec(
            i,
            data.draw(st.lists(st.integers(3, 400), min_size=1, max_size=40)),
            data.draw(st.integers(1, 12)),
            arrival=data.draw(st.floats(0, 0.01)),
            ignore_eos=data.draw(st.booleans()) if eos_drawn else True,
        )
        for i in range(n)
    ]
