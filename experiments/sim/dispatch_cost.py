"""Eager PyTorch's host cost per operator, measured on this CPU: the number behind an engine
software profile's `launches.per_kernel_s` (framework/executors/simulated/software/).

An eager GPU step issues every operator from Python: the module call, PyTorch's dispatcher,
then the driver's kernel launch, while the kernel itself runs on the device. On a CPU the
first two are the same code on the same kind of core; only the launch is the CUDA driver's.
So this runs Hugging Face's decoder layers (Llama's and OPT's, the layers of the engines the
profiles describe) eagerly on tensors so small that their arithmetic is negligible, counts
the ATen operators each layer dispatches (a `TorchDispatchMode`), and divides the layer's
time by that count: the Python and dispatch seconds per operator of eager module code.

What carries over to a GPU server's host: the interpreter and the dispatcher (a server CPU of
the same class runs them at a similar speed; name the CPU). What does not: the CUDA driver's
launch (`cudaLaunchKernel`, a few microseconds, published), and the tiny CPU kernel, which a
GPU replaces with the launch; views and metadata operators that launch nothing on a GPU are
counted here as operators too, so the per-operator figure is per dispatched operator.

    python -m experiments.sim.dispatch_cost [--repeats 2000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Count(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def llama_layer() -> tuple[torch.nn.Module, dict[str, Any]]:
    """One Llama decoder layer (grouped-query attention, SwiGLU, RMSNorm, rotary) at toy
    width, with its inputs for one decode token."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=128, attn_implementation="sdpa",
    )  # fmt: skip
    layer = LlamaDecoderLayer(cfg, 0).eval()
    x = torch.randn(1, 1, 64)
    pos = torch.zeros(1, 1, dtype=torch.long)
    emb = LlamaRotaryEmbedding(cfg)(x, pos)
    return layer, {"hidden_states": x, "position_embeddings": emb, "position_ids": pos}


def opt_layer() -> tuple[torch.nn.Module, dict[str, Any]]:
    """One OPT decoder layer (multi-head attention, ReLU MLP, LayerNorms) at toy width."""
    from transformers import OPTConfig
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    cfg = OPTConfig(
        hidden_size=64, ffn_dim=128, num_attention_heads=4, num_hidden_layers=1,
        vocab_size=128, attn_implementation="sdpa",
    )  # fmt: skip
    layer = OPTDecoderLayer(cfg, 0).eval()
    return layer, {"hidden_states": torch.randn(1, 1, 64)}


def measure(layer: torch.nn.Module, inputs: dict[str, Any], repeats: int) -> dict[str, Any]:
    """The layer's operators, and its eager seconds per call (median of 5 rounds)."""
    with torch.inference_mode():
        with _Count() as count:
            layer(**inputs)
        for _ in range(50):
            layer(**inputs)
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(repeats):
                layer(**inputs)
            rounds.append((time.perf_counter() - t0) / repeats)
    ops = sum(count.ops.values())
    per_layer = statistics.median(rounds)
    return {
        "operators": ops,
        "by_operator": dict(count.ops.most_common()),
        "layer_s": per_layer,
        "per_operator_s": per_layer / ops,
        "rounds_s": rounds,
    }


def engine_operators(layers: int) -> dict[str, float]:
    """Operators nanoserve's own executor dispatches in one prefill step (one 32-token
    prompt) and one decode step (that row's next token) of the tiny Llama with `layers`
    layers, on this CPU's eager path: `step` of a profile's `kernels_per_step` and
    `kernels_per_layer` come from two layer counts' difference."""
    from framework.core.request import RequestSpec, SamplingParams
    from framework.executors.model_loader import TinySpec, load_model
    from framework.plugin_host.registry import registry
    from framework.run.app import build_engine
    from framework.run.compose import compose_cfg

    cfg = compose_cfg(["model=tiny", f"model.tiny.num_hidden_layers={layers}",
                       "observers=[]", "engine.max_num_seqs=1"])  # fmt: skip
    model, tok = load_model(
        "tiny", None, None, torch.float32, torch.device("cpu"),
        TinySpec(num_hidden_layers=layers),
    )  # fmt: skip
    engine = build_engine(cfg, model, torch.device("cpu"), torch.float32, registry().pm.hook)
    counts: list[int] = []
    execute = engine.executor.execute

    def counted(batch: Any) -> Any:
        with _Count() as count:
            out = execute(batch)
        counts.append(sum(count.ops.values()))
        return out

    engine.executor.execute = counted  # type: ignore[method-assign]
    spec = RequestSpec(
        id="r", prompt_token_ids=list(range(1, 33)), sampling=SamplingParams(max_tokens=3)
    )
    engine.run([spec], tok.eos_token_id)
    return {"prefill": counts[0], "decode": counts[1]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # one Python thread issues the operators
    from framework.tracking.machine import cpu_info

    result: dict[str, Any] = {
        "cpu": cpu_info(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "method": "HF decoder layer, eager, toy width (64), one token; ATen ops counted by a "
        "TorchDispatchMode; median of 5 rounds of --repeats calls / operators",
        "layers": {},
    }
    for name, build in (("llama", llama_layer), ("opt", opt_layer)):
        layer, inputs = build()
        result["layers"][name] = measure(layer, inputs, args.repeats)
    two, four = engine_operators(2), engine_operators(4)
    result["nanoserve"] = {
        kind: {"per_layer": (four[kind] - two[kind]) / 2, "per_step": 2 * two[kind] - four[kind]}
        for kind in ("prefill", "decode")
    }
    for kind, r in result["nanoserve"].items():
        print(
            f"nanoserve {kind} step (CPU path): {r['per_layer']:g} operators a layer + "
            f"{r['per_step']:g} a step"
        )
    for name, r in result["layers"].items():
        print(
            f"{name}: {r['operators']} operators a layer, {r['layer_s'] * 1e6:.1f} us a layer, "
            f"{r['per_operator_s'] * 1e6:.2f} us an operator"
        )
    print(f"CPU: {result['cpu']['cpu']} (torch {torch.__version__}, one thread)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
