"""A dense decoder's sizes, read from its Hugging Face config: what an analytic profile
prices, and the parameter counts that check it against published sizes.

Two layouts of a layer are read:

- **Llama-shaped** (Llama, Mistral, Qwen2 and the configs that name their fields as Llama
  does): rotary positions, RMSNorms, grouped-query attention, a gated MLP (gate and up, SiLU
  and multiply, down), no biases unless `attention_bias` / `mlp_bias` say so; a sliding
  attention window where `sliding_window` is set on every layer (Mistral 7B v0.1).
- **OPT** (`model_type: opt`): its own field names (`ffn_dim`, `enable_bias`), multi-head
  attention, a plain MLP (up, ReLU, down: two matrices, not three), LayerNorms with a bias,
  biases on every projection, a learned position table of `max_position_embeddings + 2` rows
  (OPT's positions start at 2, as in fairseq) and an output head tied to the embedding.

`to_dict` writes the Llama field names plus whatever sets a shape apart from a Llama one
(`gated_mlp`, `norm_bias`, `learned_positions`, `sliding_window`), which `from_config` reads
back ahead of the family's defaults: a profile file round-trips.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from framework.executors.simulated.cost import ProfileError, model_id
from framework.executors.simulated.gpu.shard import Shard

# The config fields the model needs, with Hugging Face's defaults where it has one.
CONFIG_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "ffn_dim",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "enable_bias",
    "word_embed_proj_dim",
    "sliding_window",
    "use_sliding_window",
    "layer_types",
)

# OPT numbers its learned positions from 2 (fairseq's padding offset): its table has
# max_position_embeddings + 2 rows (transformers' OPTLearnedPositionalEmbedding).
OPT_POSITION_OFFSET = 2
OPT_DEFAULT_POSITIONS = 2048  # OPTConfig's max_position_embeddings


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's sizes, read from its Hugging Face config (a dict)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    model_type: str = "llama"
    gated_mlp: bool = True  # gate and up (SiLU and multiply); False: one up matrix (OPT)
    norm_bias: bool = False  # LayerNorm's weight and bias (OPT); False: RMSNorm's weight
    learned_positions: int = 0  # rows of a learned position table (OPT); 0: rotary
    sliding_window: int | None = None  # keys a query attends at most (Mistral 7B v0.1)

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "model_config") -> ModelShape:
        if not isinstance(config, dict):
            raise ProfileError(f"{where}: not a mapping")
        for moe in ("num_local_experts", "num_experts", "n_routed_experts"):
            if config.get(moe):
                raise ProfileError(
                    f"{where}.{moe}: a mixture-of-experts model; the analytic profile covers "
                    "dense models only"
                )

        def size(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if value is None:
                raise ProfileError(f"{where}.{key}: missing")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProfileError(f"{where}.{key}: must be a positive integer; got {value!r}")
            return value

        family = str(config.get("model_type") or "llama")
        opt = family == "opt"
        heads = size("num_attention_heads")
        hidden = size("hidden_size")
        if config.get("head_dim") is None and hidden % heads:
            raise ProfileError(f"{where}.head_dim: missing, and hidden_size % heads != 0")
        kv = size("num_key_value_heads", heads)  # absent (OPT, GPT-2): one KV head a head
        if heads % kv:
            raise ProfileError(f"{where}.num_key_value_heads: {kv} does not divide {heads} heads")
        if opt and config.get("word_embed_proj_dim", hidden) != hidden:
            raise ProfileError(
                f"{where}.word_embed_proj_dim: {config['word_embed_proj_dim']} is not the hidden "
                f"size {hidden}; the analytic profile prices OPT shapes without the projections "
                "in and out of the embedding (every OPT but the 350M)"
            )
        width = "ffn_dim" if opt and "ffn_dim" in config else "intermediate_size"
        bias = bool(config.get("enable_bias", True)) if opt else False

        def flag(key: str, default: bool) -> bool:
            value = config.get(key)
            return default if value is None else bool(value)

        positions = config.get("learned_positions")
        if positions is None:
            positions = (
                size("max_position_embeddings", OPT_DEFAULT_POSITIONS) + OPT_POSITION_OFFSET
                if opt
                else 0
            )
        elif isinstance(positions, bool) or not isinstance(positions, int) or positions < 0:
            raise ProfileError(f"{where}.learned_positions: rows of a table, an integer >= 0")
        return cls(
            hidden_size=hidden,
            intermediate_size=size(width),
            num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=size("head_dim", hidden // heads),
            vocab_size=size("vocab_size"),
            tie_word_embeddings=flag("tie_word_embeddings", opt),
            attention_bias=flag("attention_bias", bias),
            mlp_bias=flag("mlp_bias", bias),
            architectures=tuple(config.get("architectures") or ("LlamaForCausalLM",)),
            model_type=family,
            gated_mlp=flag("gated_mlp", not opt),
            norm_bias=flag("norm_bias", opt),
            learned_positions=positions,
            sliding_window=sliding_window(config, where),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
        }
        # What sets the shape apart from a Llama one, written only where it does, so that a
        # Llama shape's dict is the one its profiles have always held.
        if not self.gated_mlp:
            out["gated_mlp"] = False
        if self.norm_bias:
            out["norm_bias"] = True
        if self.learned_positions:
            out["learned_positions"] = self.learned_positions
        if self.sliding_window is not None:
            out["sliding_window"] = self.sliding_window
        return out

    @property
    def model_id(self) -> str:
        """`cost.model_id` of this shape, the same string a loaded config gives."""
        return model_id(SimpleNamespace(**self.to_dict()))

    # Parameter counts (elements, not bytes).
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def position_params(self) -> int:
        """A learned position table (OPT); rotary positions have none."""
        return self.learned_positions * self.hidden_size

    @property
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer (k and v are narrower under GQA)."""
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        bias = (self.q_dim + 2 * self.kv_dim + h) if self.attention_bias else 0
        return weights + bias

    @property
    def mlp_params(self) -> int:
        """Gate, up and down projections of one layer (up and down without a gate)."""
        h, i = self.hidden_size, self.intermediate_size
        if self.gated_mlp:
            return 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        return 2 * h * i + ((i + h) if self.mlp_bias else 0)

    @property
    def norm_params(self) -> int:
        """One norm: RMSNorm's weight, or LayerNorm's weight and bias."""
        return self.hidden_size * (2 if self.norm_bias else 1)

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def block_params(self) -> int:
        """Everything but the embeddings and the output head: the layers and the final norm.
        The `2 x params x tokens` FLOPs are over these."""
        return self.num_hidden_layers * self.layer_params + self.norm_params

    @property
    def total_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.embedding_params + self.position_params + self.block_params + head

    @property
    def kv_elements_per_token(self) -> int:
        """K and V of every layer for one token: what the engine's KV pool keeps of it. A
        sliding window does not shrink it: the engine keeps every token's blocks (as vLLM
        did when Mistral 7B was published), and attention reads the window's of them."""
        return self.num_hidden_layers * 2 * self.kv_dim

    def shard(self, tp: int = 1) -> Shard:
        """One of `tp` GPUs' share (Megatron's split)."""
        return Shard(
            hidden=self.hidden_size,
            intermediate=self.intermediate_size,
            heads=self.num_attention_heads,
            kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab=self.vocab_size,
            gated=self.gated_mlp,
            tp=tp,
            rotary=not self.learned_positions,
            attention_bias=self.attention_bias,
            mlp_bias=self.mlp_bias,
        )


def sliding_window(config: dict[str, Any], where: str) -> int | None:
    """The keys a query attends at most, when every layer has the same window; None without
    one. A config whose layers mix windowed and full attention (Gemma 2, some Qwen2) is
    refused: a step's features price one attention for all layers."""
    window = config.get("sliding_window")
    if window is None or config.get("use_sliding_window") is False:
        return None  # Qwen2 writes its window and turns it off
    kinds = set(config.get("layer_types") or ())
    if kinds and kinds != {"sliding_attention"}:
        if "sliding_attention" in kinds:
            raise ProfileError(
                f"{where}.layer_types: some layers attend over a sliding window and some over "
                "the whole context; the analytic profile prices one attention for every layer"
            )
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ProfileError(f"{where}.sliding_window: a positive integer or null; got {window!r}")
    return window
