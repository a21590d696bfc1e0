"""Tencent's Hunyuan (dense: ``HunYuanDenseV1ForCausalLM``, Hunyuan 0.5B to 7B; MoE: ``HunYuanMoEV1ForCausalLM``,
Hunyuan-A13B): what sets it apart from Llama, read from its config as transformers reads it. No torch.

* q and k are RMSNormed per head *after* RoPE (``query_layernorm`` / ``key_layernorm``).
* RoPE "dynamic" with an ``alpha`` is NTK-alpha scaling: a fixed base ``rope_theta * alpha ** (d / (d - 2))``
  (d: head_dim), whatever the sequence's length; served as unscaled RoPE on that base.
* The MoE (moe_config.py) routes every layer by softmax over a router (``mlp.gate.wg``), the top k
  renormalized, experts as wide as ``intermediate_size``, beside an ungated shared MLP as wide
  (``mlp.shared_mlp``). transformers reads one expert count and one top k for every layer; a published
  per-layer list (``moe_topk``) is read when its entries agree.
* Cross-layer attention (``use_cla``, KV shared between layers) is not what transformers computes: refused.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError

DENSE, MOE = "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM"
ARCHS = (DENSE, MOE)
RENAMES = ((".self_attn.query_layernorm.", ".self_attn.q_norm."), (".self_attn.key_layernorm.", ".self_attn.k_norm."),
           (".mlp.gate.wg.", ".mlp.gate."), (".mlp.shared_mlp.", ".mlp.shared_expert."))


def hunyuan_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Hunyuan sets (its RoPE base: ``ntk_alpha_rope``)."""
    if raw.get("use_cla"):
        raise ModelLoadError("config.json: use_cla is set; Hunyuan's cross-layer attention (KV shared between "
                             "layers) is not supported")
    return dict(qk_norm_after_rope=True)


def ntk_alpha_rope(theta: Any, scaling: dict[str, Any] | None, head_dim: int) -> tuple[Any, dict[str, Any] | None]:
    """(base, scaling) with NTK-alpha folded into the base, as transformers' Hunyuan computes it; others as given."""
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind != "dynamic" or not scaling.get("alpha"):
        return theta, scaling
    if head_dim < 4:
        raise ModelLoadError(f"config.json: NTK-alpha RoPE needs head_dim >= 4, got {head_dim}")
    base = float(theta if theta is not None else scaling.get("rope_theta", 10000.0))
    return base * float(scaling["alpha"]) ** (head_dim / (head_dim - 2)), None


def uniform(raw: dict[str, Any], name: str, default: int) -> int:
    """A per-model count that Hunyuan's configs may publish per layer: one value, or a list of equal ones."""
    value = raw.get(name, default)
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise ModelLoadError(f"config.json: {name} differs between layers ({value}); one value for every layer "
                                 "is supported")
        value = value[0]
    return int(value)
