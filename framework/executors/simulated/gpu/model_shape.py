"""A Llama-shaped model's sizes, read from its Hugging Face config: what an analytic profile
prices, and the parameter counts that check it against published sizes."""

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
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
)


@dataclass(frozen=True)
class ModelShape:
    """A Llama-shaped model's sizes, read from its Hugging Face config (a dict)."""

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

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "model_config") -> ModelShape:
        if not isinstance(config, dict):
            raise ProfileError(f"{where}: not a mapping")
        for moe in ("num_local_experts", "num_experts", "n_routed_experts"):
            if config.get(moe):
                raise ProfileError(
                    f"{where}.{moe}: a mixture-of-experts model; the analytic profile covers "
                    "dense Llama-shaped models only"
                )

        def size(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if value is None:
                raise ProfileError(f"{where}.{key}: missing")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProfileError(f"{where}.{key}: must be a positive integer; got {value!r}")
            return value

        heads = size("num_attention_heads")
        hidden = size("hidden_size")
        if config.get("head_dim") is None and hidden % heads:
            raise ProfileError(f"{where}.head_dim: missing, and hidden_size % heads != 0")
        kv = size("num_key_value_heads", heads)
        if heads % kv:
            raise ProfileError(f"{where}.num_key_value_heads: {kv} does not divide {heads} heads")
        return cls(
            hidden_size=hidden,
            intermediate_size=size("intermediate_size"),
            num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=size("head_dim", hidden // heads),
            vocab_size=size("vocab_size"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            architectures=tuple(config.get("architectures") or ("LlamaForCausalLM",)),
            model_type=str(config.get("model_type") or "llama"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
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
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer (k and v are narrower under GQA)."""
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        bias = (self.q_dim + 2 * self.kv_dim + h) if self.attention_bias else 0
        return weights + bias

    @property
    def mlp_params(self) -> int:
        """gate, up and down projections of one layer."""
        h, i = self.hidden_size, self.intermediate_size
        return 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden_size  # two RMSNorms

    @property
    def block_params(self) -> int:
        """Everything but the embedding and the output head: the layers and the final norm.
        The `2 x params x tokens` FLOPs are over these."""
        return self.num_hidden_layers * self.layer_params + self.hidden_size

    @property
    def total_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.embedding_params + self.block_params + head

    @property
    def kv_elements_per_token(self) -> int:
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
            gated=True,
            tp=tp,
        )
