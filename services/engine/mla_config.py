"""The latent-attention fields of a ``config.json`` (DeepSeek-V2, DeepSeek-V3 and the models built on it:
DeepSeek-R1, Kimi K2; mla.py computes it), read as transformers reads them, and their checks; no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    from services.engine.model_config import ModelConfig


def mla_fields(raw: dict[str, Any], arch: str) -> dict[str, Any]:
    """DeepSeek-V2's and -V3's latent attention (mla.py), with transformers' defaults: the cache holds one latent
    per token, so one KV head of kv_lora_rank + qk_rope_head_dim features. V3's routing must be the sigmoid
    one, V2's the softmax one (moe_config.py); V2 always rotates interleaved pairs."""
    if arch == "DeepseekV2ForCausalLM":
        if raw.get("scoring_func", "softmax") != "softmax":
            raise ModelLoadError(f"config.json: scoring_func {raw['scoring_func']!r}; DeepSeek-V2 routes by softmax")
        raw = {**raw, "rope_interleave": True}
    elif arch != "DeepseekV3ForCausalLM":
        return {}
    elif raw.get("scoring_func", "sigmoid") != "sigmoid" or raw.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ModelLoadError(f"config.json: routing {raw.get('scoring_func')!r} / {raw.get('topk_method')!r}; "
                             "DeepSeek-V3's sigmoid / noaux_tc routing is supported")
    rank, rope = int(raw.get("kv_lora_rank") or 512), int(raw.get("qk_rope_head_dim") or 64)
    q_rank = raw.get("q_lora_rank", 1536)
    return dict(kv_lora_rank=rank, q_lora_rank=int(q_rank) if q_rank else None,
                qk_nope_head_dim=int(raw.get("qk_nope_head_dim") or 128), qk_rope_head_dim=rope,
                v_head_dim=int(raw.get("v_head_dim") or 128), num_key_value_heads=1, head_dim=rank + rope,
                rope_interleaved=bool(raw.get("rope_interleave", True)))


def check_mla(config: ModelConfig) -> None:
    if not config.mla:
        raise ModelLoadError("sparse attention (index_topk) is latent attention's: set kv_lora_rank too")
    width = config.kv_lora_rank + config.qk_rope_head_dim + config.index_head_dim
    if config.num_key_value_heads != 1 or config.head_dim != width \
            or config.qk_rope_head_dim % 2 or min(config.qk_nope_head_dim, config.v_head_dim) < 1:
        raise ModelLoadError(f"config.json: latent attention needs an even qk_rope_head_dim and positive "
                             f"qk_nope_head_dim and v_head_dim (got {config.qk_rope_head_dim}, "
                             f"{config.qk_nope_head_dim}, {config.v_head_dim}), cached as one head of "
                             "kv_lora_rank + qk_rope_head_dim (+ index_head_dim with sparse attention)")
    if config.index_topk and (config.index_topk < 1 or config.index_n_heads < 1 or not config.q_lora_rank
                              or config.index_head_dim < config.qk_rope_head_dim):
        raise ModelLoadError(f"config.json: sparse attention needs index_topk >= 1, index_n_heads >= 1, a "
                             f"q_lora_rank and index_head_dim >= qk_rope_head_dim ({config.qk_rope_head_dim}); got "
                             f"{config.index_topk}, {config.index_n_heads}, {config.q_lora_rank}, "
                             f"{config.index_head_dim}")
    if not config.index_topk and (config.index_head_dim or config.index_n_heads or config.index_shared_layers
                                  or config.index_rope_interleaved):
        raise ModelLoadError("index_head_dim, index_n_heads, index_shared_layers and index_rope_interleaved are "
                             "sparse attention's: set index_topk too")
    if config.index_shared_layers and (0 in config.index_shared_layers
                                       or not set(config.index_shared_layers) < set(range(config.num_hidden_layers))):
        raise ModelLoadError(f"layers sharing an earlier layer's choice of keys {config.index_shared_layers} must be "
                             f"among the {config.num_hidden_layers} layers, after the first (which chooses)")
