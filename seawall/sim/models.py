"""Model shapes the cost model knows, and the sizes derived from them (weights, KV bytes per token).

Shapes are those of the Hugging Face ``config.json`` of each checkpoint. Weights are 16-bit; KV too, or one byte
an element as a float8 cache (``with_kv_cache_dtype``: ``--kv-cache-dtype fp8``) stores it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.common.errors import InvalidArgument
from services.engine.config import KV_CACHE_DTYPES  # the workers' --kv-cache-dtype (no torch)

DTYPE_BYTES = 2


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool  # SwiGLU (three matrices) vs a plain two-matrix MLP (OPT)
    max_context: int
    tied_embeddings: bool = False
    # A mixture of experts in every layer (Mixtral, Qwen3-MoE): routed SwiGLU experts, how many each token
    # runs, each one's width. intermediate_size is then a dense MLP beside them that every token runs (a
    # shared expert; 0: none).
    num_experts: int = 0
    experts_per_token: int = 0
    expert_size: int = 0
    kv_dtype_bytes: int = DTYPE_BYTES  # 1: a float8 KV cache

    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    @property
    def expert_params(self) -> int:
        """One routed expert's parameters (gate, up, down)."""
        return 3 * self.hidden_size * self.expert_size

    @property
    def linear_params_per_layer(self) -> int:
        """Parameters of one layer's matrix multiplies (q, k, v, o, the MLP, the router and every expert)."""
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        router = self.hidden_size * self.num_experts
        return self.attention_params_per_layer + mlp + router + self.num_experts * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token runs through (MoE: its experts only; dense: all of them)."""
        unused = (self.num_experts - self.experts_per_token) * self.expert_params
        return self.num_params - self.num_layers * unused

    @property
    def linear_params(self) -> int:
        return self.num_layers * self.linear_params_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        embeddings = self.lm_head_params * (1 if self.tied_embeddings else 2)
        return self.linear_params + embeddings

    @property
    def weight_bytes(self) -> int:
        return self.num_params * DTYPE_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers (all KV heads, before tensor-parallel sharding)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def activation_bytes(self, num_tokens: int, tp: int) -> int:
        """Peak activation memory of a forward pass over ``num_tokens`` tokens, per GPU (rough: the
        residual stream, q/k/v and the MLP's widest tensors, plus fp32 logits of one row per sequence)."""
        widest = max(self.intermediate_size, self.experts_per_token * self.expert_size)
        per_token = (8 * self.hidden_size + 2 * widest) * DTYPE_BYTES // tp
        return num_tokens * per_token


MODELS: dict[str, ModelSpec] = {
    m.name.lower(): m
    for m in (
        ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 128, 11008, 32000, True, 4096),
        ModelSpec("Mistral-7B", 32, 4096, 32, 8, 128, 14336, 32000, True, 32768),  # Instruct-v0.2
        ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, True, 8192),
        ModelSpec("Yi-34B", 60, 7168, 56, 8, 128, 20480, 64000, True, 200_000),  # Yi-34B-200K, as Sarathi-Serve
        ModelSpec("Llama-2-70B", 80, 8192, 64, 8, 128, 28672, 32000, True, 4096),
        ModelSpec("Qwen2.5-32B", 64, 5120, 40, 8, 128, 27648, 152064, True, 32768),
        ModelSpec("OPT-13B", 40, 5120, 40, 40, 128, 20480, 50272, False, 2048, tied_embeddings=True),
        # Mixtures of experts: 46.7B parameters, 12.9B active; 30.5B, 3.3B active.
        ModelSpec("Mixtral-8x7B", 32, 4096, 32, 8, 128, 0, 32000, True, 32768, num_experts=8,
                  experts_per_token=2, expert_size=14336),
        ModelSpec("Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 0, 151936, True, 40960, num_experts=128,
                  experts_per_token=8, expert_size=768),
        # GPT-OSS as Seawall serves it (experts unpacked from MXFP4 to bf16): 20.9B and 116.8B parameters.
        # Half the layers attend within 128 keys; the cost model charges them full attention.
        ModelSpec("gpt-oss-20b", 24, 2880, 64, 8, 64, 0, 201088, True, 131072, num_experts=32,
                  experts_per_token=4, expert_size=2880),
        ModelSpec("gpt-oss-120b", 36, 2880, 64, 8, 64, 0, 201088, True, 131072, num_experts=128,
                  experts_per_token=4, expert_size=2880),
    )
}


def check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InvalidArgument(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """``model`` with its KV as ``--kv-cache-dtype`` stores it: 16-bit (auto) or one byte an element (fp8)."""
    check_kv_cache_dtype(kv_cache_dtype)
    return model if kv_cache_dtype == "auto" else replace(model, kv_dtype_bytes=1)


def get_model(name: str) -> ModelSpec:
    model = MODELS.get(name.lower())
    if model is None:
        raise InvalidArgument(f"unknown model {name!r}; known: {', '.join(m.name for m in MODELS.values())}")
    return model
