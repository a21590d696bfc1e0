"""The mixture-of-experts fields of a ``config.json`` (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GPT-OSS, GLM-4.5,
dots.llm1, MiniMax-M2, DeepSeek-V2 and -V3, Llama 4, ERNIE 4.5, AFMoE, K-EXAONE, Hunyuan), read as
transformers reads them, and their checks; no torch (the scheduler reads configs too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.hunyuan import uniform

if TYPE_CHECKING:
    from services.engine.model_config import ModelConfig

# transformers' defaults for what an MoE config.json may leave out: experts, experts per token, expert width
# (None: intermediate_size), shared expert width (Qwen2-MoE).
MOE_DEFAULTS = {"MixtralForCausalLM": (8, 2, None, 0), "Qwen2MoeForCausalLM": (60, 4, 1408, 5632),
                "Qwen3MoeForCausalLM": (128, 8, 768, 0), "OlmoeForCausalLM": (64, 8, None, 0),
                "GptOssForCausalLM": (128, 4, None, 0), "Glm4MoeForCausalLM": (128, 8, 1408, 0),
                "GraniteMoeForCausalLM": (8, 2, None, 0), "GraniteMoeSharedForCausalLM": (8, 2, None, 0),
                "Dots1ForCausalLM": (128, 6, 1408, 0), "MiniMaxM2ForCausalLM": (256, 8, None, 0),
                "DeepseekV2ForCausalLM": (64, 0, 1407, 0), "DeepseekV3ForCausalLM": (256, 8, 2048, 0),
                "Llama4ForCausalLM": (16, 1, None, 0), "Ernie4_5_MoeForCausalLM": (64, 6, 1536, 2),
                "AfmoeForCausalLM": (64, 6, 1408, 2), "ExaoneMoeForCausalLM": (64, 8, 1024, 1),
                "HunYuanMoEV1ForCausalLM": (1, 1, None, 0)}
# DeepSeek-V3's fields (n_routed_experts, n_shared_experts, first_k_dense_replace, n_group, ...), and the
# defaults transformers gives them per architecture: norm_topk_prob, first_k_dense_replace, n_shared_experts.
_DEEPSEEK_STYLE = {"Glm4MoeForCausalLM": (True, 1, 1), "Dots1ForCausalLM": (False, 0, 0),
                   "DeepseekV2ForCausalLM": (False, 0, 2), "DeepseekV3ForCausalLM": (True, 3, 1)}
MOE_ROUTINGS = ("softmax", "softmax_fp32", "topk_softmax", "sigmoid", "group_softmax", "sigmoid_input", "softmax_biased",
                "sparsemixer", "softmax_grouped", "topk_sigmoid", "logit_biased_sigmoid")


def moe_fields(raw: dict[str, Any], arch: str, layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields, as transformers reads them: Mixtral routes in every layer, experts as wide
    as ``intermediate_size``, top-k renormalized; OLMoE the same, renormalized only with ``norm_topk_prob``;
    Qwen routes in every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``, experts
    ``moe_intermediate_size`` wide, renormalized only with ``norm_topk_prob``; GPT-OSS routes in every layer,
    softmax over the top-k logits of a router with a bias, to experts with biases and a clamped SwiGLU; GLM-4.5
    and dots.llm1 route from layer ``first_k_dense_replace`` on, by sigmoid scores within groups (DeepSeek-V3's
    routing), beside ``n_shared_experts`` shared experts' worth of an ungated shared expert; MiniMax-M2 routes
    in every layer by sigmoid scores, its router in the model's dtype; DeepSeek-V2 as dots.llm1 but by softmax
    scores (``_deepseek_v2_routing``); Llama 4 routes in every ``interleave_moe_layer_step``-th layer (or its
    ``moe_layers``) by the sigmoid of the top-k logits, which scales each token into its experts, beside an
    ungated shared expert as wide as the experts (``intermediate_size``); ERNIE 4.5 routes in every
    ``moe_layer_interval``-th layer from ``moe_layer_start_index`` to ``moe_layer_end_index``, picking experts by
    softmax probability plus a correction bias, weighing them by the probability alone, renormalized, beside
    ``moe_num_shared_experts`` experts' worth of an ungated shared expert."""
    if arch not in MOE_DEFAULTS:
        return {}
    experts, top_k, width, shared = MOE_DEFAULTS[arch]
    if arch in _READERS:
        return _READERS[arch](raw, layers, experts, top_k, width, shared)
    if arch == "Ernie4_5_MoeForCausalLM":  # moe_* names (num_experts, num_experts_per_tok as aliases)
        width = int(raw.get("moe_intermediate_size") or width)
        end = int(raw.get("moe_layer_end_index", -1))
        start, step, end = int(raw.get("moe_layer_start_index", 1)), int(raw.get("moe_layer_interval") or 1), \
            layers - 1 if end == -1 else end
        return dict(num_experts=int(raw.get("moe_num_experts") or raw.get("num_experts") or experts),
                    num_experts_per_tok=int(raw.get("moe_k") or raw.get("num_experts_per_tok") or top_k),
                    moe_intermediate_size=width, norm_topk_prob=True, moe_routing="softmax_biased",
                    moe_layers=tuple(i for i in range(layers) if (i + 1) % step == 0 and start <= i <= end),
                    shared_expert_intermediate_size=width * int(raw.get("moe_num_shared_experts", shared) or 0),
                    shared_expert_gated=False)
    if arch == "Llama4ForCausalLM":
        width, step, moe = int(raw.get("intermediate_size") or 8192), int(raw.get("interleave_moe_layer_step") or 1), \
            raw.get("moe_layers")
        return dict(num_experts=int(raw.get("num_local_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k), moe_intermediate_size=width,
                    moe_layers=tuple(moe) if moe is not None else tuple(range(step - 1, layers, step)),
                    moe_routing="sigmoid_input", router_fp32=False, shared_expert_intermediate_size=width,
                    shared_expert_gated=False)
    if arch == "MixtralForCausalLM":
        return dict(num_experts=int(raw.get("num_local_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k),
                    moe_intermediate_size=int(raw["intermediate_size"]), norm_topk_prob=True,
                    moe_layers=tuple(range(layers)), routing_weights_fp32=True)
    if arch == "GptOssForCausalLM":
        return dict(num_experts=int(raw.get("num_local_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k),
                    moe_intermediate_size=int(raw["intermediate_size"]), moe_layers=tuple(range(layers)),
                    moe_routing="topk_softmax", router_fp32=False, moe_biases=True, swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
                    swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)))
    if arch.startswith("GraniteMoe"):  # the softmax of the top-k logits, in fp32; Shared: an ungated shared MLP
        return dict(num_experts=int(raw.get("num_local_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k),
                    moe_intermediate_size=int(raw["intermediate_size"]), moe_layers=tuple(range(layers)),
                    moe_routing="topk_softmax", shared_expert_gated=False,
                    shared_expert_intermediate_size=int(raw.get("shared_intermediate_size") or 0)
                    if arch == "GraniteMoeSharedForCausalLM" else 0)
    if arch == "MiniMaxM2ForCausalLM":
        return dict(num_experts=int(raw.get("num_local_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k),
                    moe_intermediate_size=int(raw["intermediate_size"]), norm_topk_prob=True,
                    moe_layers=tuple(range(layers)), moe_routing="sigmoid", router_fp32=False,
                    routing_weights_fp32=True)
    if arch in _DEEPSEEK_STYLE:
        normalize, dense, shared = _DEEPSEEK_STYLE[arch]
        first = raw.get("first_k_dense_replace")
        first, width = int(dense if first is None else first), int(raw.get("moe_intermediate_size") or width)
        if first >= layers:  # Youtu-LLM (aliases.py): latent attention over dense MLPs only
            return {}
        return dict(num_experts=int(raw.get("n_routed_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k), moe_intermediate_size=width,
                    norm_topk_prob=bool(raw.get("norm_topk_prob", normalize)), moe_layers=tuple(range(first, layers)),
                    shared_expert_intermediate_size=width * int(  # 0: none (MiMo-V2-Flash), as transformers reads it
                        shared if raw.get("n_shared_experts") is None else raw["n_shared_experts"]),
                    shared_expert_gated=False, moe_routing="sigmoid", moe_groups=int(raw.get("n_group") or 1),
                    moe_topk_groups=int(raw.get("topk_group") or 1),
                    routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)), routing_weights_fp32=True) | (
                        _deepseek_v2_routing(raw) if arch == "DeepseekV2ForCausalLM" else {})
    if arch == "OlmoeForCausalLM":
        return dict(num_experts=int(raw.get("num_experts") or experts),
                    num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k),
                    moe_intermediate_size=int(raw["intermediate_size"]),
                    norm_topk_prob=bool(raw.get("norm_topk_prob", False)), moe_layers=tuple(range(layers)))
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = raw.get("mlp_only_layers") or []
    if step < 1 or not isinstance(dense, list):
        raise ModelLoadError("config.json: decoder_sparse_step must be >= 1 and mlp_only_layers a list of layers")
    # transformers >= 5 writes Qwen3-MoE's expert count as num_local_experts; hub checkpoints say num_experts.
    num = int(raw.get("num_experts") or raw.get("num_local_experts") or experts)
    return dict(num_experts=num, num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k),
                moe_intermediate_size=int(raw.get("moe_intermediate_size") or width),
                norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                moe_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0) if num else (),
                shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", shared) or 0)
                if arch == "Qwen2MoeForCausalLM" else 0)


def _afmoe(raw: dict[str, Any], layers: int, experts: int, top_k: int, width: int, shared: int) -> dict[str, Any]:
    """AFMoE (afmoe.py): DeepSeek-V3's sigmoid routing without groups, its router in the model's dtype, from
    ``num_dense_layers`` on, scaled by ``route_scale``."""
    dense = raw.get("num_dense_layers", 1)
    width = int(raw.get("moe_intermediate_size") or width)
    return dict(num_experts=int(raw.get("num_experts") or experts),
                num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k), moe_intermediate_size=width,
                norm_topk_prob=True, moe_layers=tuple(range(int(dense or 0), layers)), moe_routing="sigmoid",
                routed_scaling_factor=float(raw.get("route_scale") or 1.0), router_fp32=False,
                routing_weights_fp32=True, shared_expert_gated=False,
                shared_expert_intermediate_size=width * int(raw.get("num_shared_experts", shared) or 0))


def _exaone_moe(raw: dict[str, Any], layers: int, experts: int, top_k: int, width: int, shared: int,
                ) -> dict[str, Any]:
    """K-EXAONE: DeepSeek-V3's routing under its own names, layers by ``mlp_layer_types``."""
    width = int(raw.get("moe_intermediate_size") or width)
    return dict(num_experts=int(raw.get("num_experts") or experts),
                num_experts_per_tok=int(raw.get("num_experts_per_tok") or top_k), moe_intermediate_size=width,
                norm_topk_prob=bool(raw.get("norm_topk_prob", True)), moe_layers=_routed_layers(raw, layers),
                shared_expert_intermediate_size=width * int(raw.get("num_shared_experts", shared) or 0),
                shared_expert_gated=False, moe_routing="sigmoid", moe_groups=int(raw.get("n_group") or 1),
                moe_topk_groups=int(raw.get("topk_group") or 1),
                routed_scaling_factor=float(raw.get("routed_scaling_factor", 2.5)), routing_weights_fp32=True)


def _hunyuan(raw: dict[str, Any], layers: int, experts: int, top_k: int, width: int, shared: int) -> dict[str, Any]:
    """Hunyuan's MoE (hunyuan.py): softmax routing in every layer, renormalized, experts and the ungated shared
    MLP as wide as ``intermediate_size``."""
    width = int(raw["intermediate_size"])
    return dict(num_experts=uniform(raw, "num_experts", experts), num_experts_per_tok=uniform(raw, "moe_topk", top_k),
                moe_intermediate_size=width, norm_topk_prob=True, moe_layers=tuple(range(layers)),
                shared_expert_intermediate_size=width, shared_expert_gated=False, moe_routing="softmax_fp32")


_READERS = {"AfmoeForCausalLM": _afmoe, "ExaoneMoeForCausalLM": _exaone_moe, "HunYuanMoEV1ForCausalLM": _hunyuan}


def _routed_layers(raw: dict[str, Any], layers: int) -> tuple[int, ...]:
    """The layers ``mlp_layer_types`` calls "sparse", else those from ``first_k_dense_replace`` (default 1) on."""
    types = raw.get("mlp_layer_types")
    if types is None:
        return tuple(range(int(raw.get("first_k_dense_replace", 1)), layers))
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"dense", "sparse"}:
        raise ModelLoadError(f"config.json: mlp_layer_types must list 'dense' or 'sparse' for each of the {layers} "
                             f"layers, got {types!r}")
    return tuple(i for i, kind in enumerate(types) if kind == "sparse")


def _deepseek_v2_routing(raw: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2's softmax routing as transformers computes it: "greedy" (V2-Lite) picks the top k of all
    experts, "group_limited_greedy" (V2, V2.5) within the topk_group groups with the best single score; the
    weights are not renormalized (transformers reads no norm_topk_prob, so a config asking for it is
    refused), and every layer from first_k_dense_replace routes (moe_layer_freq must be 1)."""
    method = raw.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise ModelLoadError(f"config.json: topk_method {method!r}; DeepSeek-V2 routes by greedy or "
                             "group_limited_greedy")
    if raw.get("norm_topk_prob") or int(raw.get("moe_layer_freq") or 1) != 1:
        raise ModelLoadError("config.json: norm_topk_prob true or moe_layer_freq other than 1; DeepSeek-V2 is "
                             "served as released (routing weights not renormalized, every layer routing)")
    if not raw.get("num_experts_per_tok"):
        raise ModelLoadError("config.json: DeepSeek-V2 needs num_experts_per_tok (experts per token)")
    grouped = method == "group_limited_greedy"
    return dict(moe_routing="group_softmax", norm_topk_prob=False,
                moe_groups=int(raw.get("n_group") or 0) if grouped else 1,
                moe_topk_groups=int(raw.get("topk_group") or 0) if grouped else 1)


def check_moe(config: ModelConfig) -> None:
    """The mixture-of-experts fields of ``config`` (none to check without experts but those that need them)."""
    if (config.shared_expert_averaged and not config.shared_expert_intermediate_size) or (
            config.moe_output_norm and not config.moe_layers):
        raise ModelLoadError("shared_expert_averaged needs a shared expert (shared_expert_intermediate_size > 0), "
                             "moe_output_norm layers that route (moe_layers)")
    if not config.num_experts:
        return
    if not 1 <= config.num_experts_per_tok <= config.num_experts:
        raise ModelLoadError(f"config.json: num_experts_per_tok must be between 1 and the number of experts "
                             f"({config.num_experts}), got {config.num_experts_per_tok}")
    if config.moe_intermediate_size < 1 or config.shared_expert_intermediate_size < 0:
        raise ModelLoadError("config.json: moe_intermediate_size must be >= 1 and shared_expert_intermediate_size "
                             f">= 0, got {config.moe_intermediate_size} and {config.shared_expert_intermediate_size}")
    if config.hidden_act != "silu" and (config.mlp_gated or config.hidden_act == "xielu"):
        raise ModelLoadError(f"config.json: experts with hidden activation {config.hidden_act!r}; gated experts "
                             "are SwiGLU (silu), ungated ones (Nemotron-H's) relu2 or GELU")
    if config.moe_routing not in MOE_ROUTINGS:
        raise ModelLoadError(f"moe_routing must be one of {', '.join(MOE_ROUTINGS)}, got {config.moe_routing!r}")
    if config.moe_routing == "sparsemixer" and (config.num_experts_per_tok != 2 or not config.sparsemixer_eps >= 0):
        raise ModelLoadError(f"config.json: sparse-mixer routing picks 2 experts with a jitter margin >= 0, got "
                             f"num_experts_per_tok {config.num_experts_per_tok}, margin {config.sparsemixer_eps}")
    if config.router_softcap is not None and config.moe_routing != "sigmoid":
        raise ModelLoadError(f"router_softcap caps a sigmoid router's logits; moe_routing is {config.moe_routing!r}")
    groups, chosen = config.moe_groups, config.moe_topk_groups
    if groups < 1 or config.num_experts % groups or not 1 <= chosen <= groups or (
            groups > 1 and config.num_experts // groups < 2) or config.num_experts_per_tok > chosen * (
            config.num_experts // groups):
        raise ModelLoadError(f"config.json: {config.num_experts} experts in n_group {groups} groups of at least 2, "
                             f"topk_group {chosen} of them, must hold num_experts_per_tok "
                             f"({config.num_experts_per_tok}) experts")
    if not config.swiglu_alpha > 0:
        raise ModelLoadError(f"config.json: swiglu_alpha must be > 0, got {config.swiglu_alpha}")
    if any(not 0 <= layer < config.num_hidden_layers for layer in config.moe_layers):
        raise ModelLoadError(f"config.json: mixture-of-experts layers {config.moe_layers} outside the "
                             f"{config.num_hidden_layers} layers")
