"""LoRA adapters in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``), read and checked
without torch: the scheduler checks an adapter against the base model before it serves it, and each worker
loads the same files by the path a sequence names (``services/engine/lora.py``).

An adapter adds ``scaling * B(A(x))`` to some of each layer's projections: A is ``[r, in]``, B ``[out, r]``,
``scaling = lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), per module where ``rank_pattern`` / ``alpha_pattern``
say so. An adapter of a sequence classifier (PEFT's ``task_type: SEQ_CLS``) also saves the classifier's head
whole (``modules_to_save``: ``score``), which replaces the base model's for its requests. What PEFT can save
beyond that (DoRA, biases, embedding or lm_head adapters, other modules saved whole, variants whose forward is
not ``B(A(x))``) is refused with what was found. Projections the model holds as checkpoints do
(a linear-attention mixer's, an output gate, latent attention's: ``ModelShape.projections``) are adapted as
they are, each in the layers that have it.

An activated LoRA (aLoRA: ``alora_invocation_tokens``) applies from the start of the last occurrence of its
invocation tokens in the prompt on (``activation_start``), and not at all where the prompt lacks them, as PEFT
applies it: the KV before that point is the base model's.

An MoE's stacked experts are adapted as parameters (PEFT's ``target_parameters``): one A ``[r·E, in]`` and one B
``[out, r·E]`` per stacked projection, expert e's A the rows ``e·r ..``, its B the columns ``e, e+E, ..``. Their
keys do not name the parameter: PEFT wraps a module's parameters one around the other in the order the module
registers them, so ``experts.base_layer.lora_A`` adapts the first (gate_up_proj) and ``experts.lora_A`` the last.

Adapters name the modules of the checkpoint they were trained on (GPT-2's ``c_attn``, BLOOM's
``query_key_value``, OPT's ``fc1``): each is read under the name the model holds that weight by
(``ModelShape.names``), as the loader renames the checkpoint's tensors.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from services.common.errors import InvalidArgument
from services.common.lora_shape import (
    ATTENTION_MODULES,
    EXPERT_PARAMS,
    FUSED_MODULES,
    MLP_MODULES,
    MODULES,
    PARTS,
    Q_GATE,
    SHARED,
    ModelShape,
)
from services.common.step import LoraRef

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])\.weight$")
# A module saved whole (modules_to_save): its tensors under the module's own path.
_WHOLE = re.compile(r"^(?:base_model\.model\.)?(.+)\.(weight|bias)$")
# The classifier head's name in ...ForSequenceClassification checkpoints (the model holds it as ``score``).
HEAD = "score"
# A stacked experts module wrapped by PEFT once per adapted parameter: its path and how deep this wrapper is.
_WRAPPED_EXPERTS = re.compile(r"^(.+\.experts)((?:\.base_layer)*)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


@dataclass(frozen=True)
class LoraSpec:
    """A checked adapter: its rank, scaling and the (layer, module) pairs it changes, each with its own rank and
    scaling where ``rank_pattern`` / ``alpha_pattern`` set them."""

    ref: LoraRef
    rank: int
    scaling: float
    # (layer, module as the model names it) -> (A tensor name, B tensor name) in the safetensors file.
    tensors: dict[tuple[int, str], tuple[str, str]] = field(default_factory=dict)
    # (layer, module) -> its scaling, where it is not ``scaling``.
    scalings: dict[tuple[int, str], float] = field(default_factory=dict)
    # An activated LoRA's invocation tokens (empty: a plain LoRA, applied to every token).
    invocation_tokens: tuple[int, ...] = ()
    # The tensor name of a classifier head saved whole (modules_to_save ``score``), [num_labels, hidden].
    head: str | None = None

    @property
    def weights_path(self) -> Path:
        return Path(self.ref.path) / WEIGHTS_FILE


def adapted_weight(key: str) -> str:
    """The checkpoint weight an adapter's A or B tensor adapts: ``base_model.model.X.lora_B.weight`` adapts
    ``X.weight``."""
    m = _KEY.match(key)
    if m is None:
        raise ValueError(f"{key!r} is not a LoRA A/B weight")
    return f"{m[1]}.weight"


def activation_start(prompt: Sequence[int], invocation: Sequence[int]) -> int | None:
    """The first position an adapter applies to: 0 for a plain LoRA; for an activated one, the start of the
    last occurrence of its invocation tokens in ``prompt``, None (never) where there is none (PEFT's
    ``calculate_alora_offsets``)."""
    if not invocation:
        return 0
    n, first = len(invocation), invocation[0]
    for start in range(len(prompt) - n, -1, -1):
        if prompt[start] == first and list(prompt[start:start + n]) == list(invocation):
            return start
    return None


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidArgument(f"LoRA name {name!r}: use 1-128 letters, digits and . _ : / - (starting with a "
                              "letter or digit)")
    return name


def read_lora(ref: LoraRef, shape: ModelShape, max_rank: int) -> LoraSpec:
    """Reads and checks an adapter's config and tensor shapes (no tensor data is read); raises
    ``InvalidArgument`` saying what does not fit."""
    where = f"LoRA {ref.name!r} ({ref.path})"
    if shape.no_adapters:
        raise InvalidArgument(f"{where}: {shape.no_adapters}")
    root = Path(ref.path)
    try:
        cfg = json.loads((root / CONFIG_FILE).read_text())
    except OSError as exc:
        raise InvalidArgument(f"{where}: cannot read {CONFIG_FILE}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{where}: {CONFIG_FILE} is not JSON: {exc}") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
        raise InvalidArgument(f"{where}: not a LoRA adapter (peft_type {cfg.get('peft_type')!r})")
    _refuse_extras(cfg, where)
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        raise InvalidArgument(f"{where}: r must be a positive integer and lora_alpha a number")
    ranks, alphas = _pattern(cfg, "rank_pattern", where, int), _pattern(cfg, "alpha_pattern", where, int | float)
    if (highest := max([rank, *ranks.values()])) > max_rank:
        raise InvalidArgument(f"{where}: rank {highest} is above --max-lora-rank {max_rank}; raise the flag")

    def scaling_of(r: int, a: float) -> float:
        return float(a / (math.sqrt(r) if cfg.get("use_rslora") else r))

    def rank_of(module: str) -> int:
        return _by_pattern(ranks, module, rank)

    saved = cfg.get("modules_to_save") or []
    if not isinstance(saved, list) or not all(isinstance(name, str) for name in saved):
        raise InvalidArgument(f"{where}: modules_to_save must be a list of module names, got {saved!r}")
    tensors, whole = _tensor_names(root / WEIGHTS_FILE, where, rank_of, shape, cfg.get("target_parameters") or [],
                                   saved)
    scaling = scaling_of(rank, alpha)
    scalings = {}
    for key, (_, _, module) in tensors.items():
        if (s := scaling_of(rank_of(module), _by_pattern(alphas, module, alpha))) != scaling:
            scalings[key] = s
    invocation = cfg.get("alora_invocation_tokens") or []
    if not isinstance(invocation, list) or not all(isinstance(t, int) and t >= 0 for t in invocation):
        raise InvalidArgument(f"{where}: alora_invocation_tokens must be a list of token ids")
    head = _head(where, whole, shape)
    if head is not None and invocation:
        raise InvalidArgument(f"{where}: an activated LoRA (alora_invocation_tokens) with its own classifier head "
                              "is not supported; a plain LoRA's head is")
    return LoraSpec(ref, rank, scaling, {key: (a, b) for key, (a, b, _) in tensors.items()}, scalings,
                    tuple(invocation), head)


def _head(where: str, whole: dict[str, tuple[int, ...]], shape: ModelShape) -> str | None:
    """The tensor of the classifier head an adapter saved whole, checked; raises ``InvalidArgument`` for any
    other module saved whole (vLLM serves none either: an lm_head or embeddings per adapter is a copy of the
    vocabulary's weights per adapter)."""
    head = next((key for key in whole if _WHOLE.match(key)[1] == HEAD and key.endswith(".weight")), None)
    others = [key for key in whole if key != head]
    if others:
        raise InvalidArgument(f"{where}: modules saved whole (modules_to_save) are supported for a sequence "
                              f"classifier's head ({HEAD}.weight) only; found {', '.join(others)}")
    if head is None:
        return None
    if not shape.num_labels:
        raise InvalidArgument(f"{where}: saves a classifier head ({head}) whole, but the model is no sequence "
                              "classifier (an adapter for a ...ForSequenceClassification checkpoint?)")
    want = (shape.num_labels, shape.hidden_size)
    if whole[head] != want:
        raise InvalidArgument(f"{where}: {head} has shape {whole[head]}; this classifier's head is {want} "
                              f"({shape.num_labels} labels)")
    return head


def _pattern(cfg: dict, name: str, where: str, kind) -> dict[str, int | float]:
    """PEFT's per-module values (``rank_pattern``, ``alpha_pattern``): pattern -> value, checked."""
    pattern = cfg.get(name) or {}
    if not isinstance(pattern, dict) or not all(isinstance(v, kind) and v > 0 for v in pattern.values()):
        raise InvalidArgument(f"{where}: {name} must map module patterns to positive numbers")
    for key in pattern:
        try:
            re.compile(key)
        except re.error as exc:
            raise InvalidArgument(f"{where}: {name} key {key!r} is not a regular expression: {exc}") from None
    return pattern


def _by_pattern(pattern: dict, module: str, default):
    """A module's value in a PEFT pattern dict as PEFT picks it (``get_pattern_key``): the first pattern that
    matches the end of its name, after a dot; else ``default``."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _refuse_extras(cfg: dict, where: str) -> None:
    # fan_in_fan_out (PEFT sets it for GPT-2's Conv1D layers) says how to merge B·A into the base weight; the
    # adapter's own tensors are [r, in] and [out, r] either way, and merging is not how they are applied here.
    unsupported = {
        "use_dora": "DoRA adapters", "lora_bias": "LoRA biases (lora_bias)",
        "trainable_token_indices": "trainable token indices", "layer_replication": "layer replication",
        # Variants whose forward pass is not B(A(x)): a diagonal between A and B over a truncated base weight,
        # inputs pooled by group, sampled factors, adapters routed per token.
        "kasa_config": "KaSA adapters", "use_qalora": "QALoRA adapters", "monteclora_config": "MonteCLoRA adapters",
        "arrow_config": "Arrow routing",
    }
    found = [what for key, what in unsupported.items() if cfg.get(key)]
    targets = cfg.get("target_parameters") or []
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        found.append(f"target_parameters {targets!r} (a list of parameter names is)")
    else:
        found += [f"adapters of parameter {t!r} (of parameters, only an MoE's stacked experts' "
                  f"{', '.join(EXPERT_PARAMS)})" for t in targets if t.rpartition(".")[2] not in EXPERT_PARAMS]
    if cfg.get("bias", "none") != "none":
        found.append(f"bias {cfg['bias']!r}")
    if found:
        raise InvalidArgument(f"{where}: {', '.join(found)} not supported; a plain LoRA (A and B per "
                              f"projection, bias 'none') is")


def _module(where: str, key: str, weight: str, shape: ModelShape) -> tuple[int, str]:
    """(layer, module as LoraSpec names it) of the weight an adapter's tensor ``key`` adapts, checked; raises
    ``InvalidArgument`` saying what does not fit."""
    plain = shape.projection(weight)
    if plain is not None:
        layers = sorted({i for name, _, _, held in shape.projections if name == plain[1] for i in held})
        if plain[0] not in layers:
            raise InvalidArgument(f"{where}: adapts {plain[1]} of layer {plain[0]}; that projection is adapted in "
                                  f"layers {', '.join(map(str, layers))} only")
        return plain
    found = shape.module(weight)
    if found is None:
        supported = ", ".join([*MODULES, *(p[0] for p in shape.projections)])
        raise InvalidArgument(f"{where}: tensor {key!r} is not a LoRA A/B weight of a decoder layer's projection "
                              f"({supported})")
    layer, sublayer, module = found
    if (sublayer == "self_attn") != (module in ATTENTION_MODULES):  # AFMoE's self_attn.gate_proj
        raise InvalidArgument(f"{where}: adapts {sublayer}.{module}; supported: the attention's "
                              f"{', '.join(ATTENTION_MODULES)} and the MLP's {', '.join(MLP_MODULES)}")
    shared = sublayer == "mlp.shared_expert"
    _check_module(where, layer, module, shape, shared)
    return layer, SHARED + module if shared else module


def _check_module(where: str, layer: int, module: str, shape: ModelShape, shared: bool) -> None:
    """Refuses an adapter of a projection this model does not have, saying which ones it may adapt; ``shared``:
    of an MoE layer's shared expert."""
    if module not in (*MODULES, *PARTS, *((Q_GATE,) if shape.query_gates else ())):
        raise InvalidArgument(f"{where}: adapts {module!r}; supported: {', '.join((*MODULES, *FUSED_MODULES))}")
    if layer >= shape.num_layers:
        raise InvalidArgument(f"{where}: adapts layer {layer}; the model has {shape.num_layers}")
    if not shape.gated_mlp and module in ("gate_proj", "gate_up_proj"):
        raise InvalidArgument(f"{where}: adapts {module}; this model's MLP has no gate (up_proj and down_proj "
                              "only)")
    if shape.latent_attention and module in ATTENTION_MODULES:
        raise InvalidArgument(f"{where}: adapts {module}; latent attention (DeepSeek-V3's) has q_a_proj and "
                              "q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_b_proj and o_proj")
    if shared and (layer not in shape.moe_layers or not shape.shared_intermediate):
        raise InvalidArgument(f"{where}: adapts the shared expert's {module} of layer {layer}, which has none")
    if layer in shape.moe_layers and module not in ATTENTION_MODULES and not shared:
        raise InvalidArgument(f"{where}: adapts {module} of layer {layer}, whose MLP is a mixture of experts; "
                              "adapters of the attention projections, of the experts (target_parameters) and "
                              "of a shared expert are supported there")


def _tensor_names(path: Path, where: str, rank_of: Callable[[str], int], shape: ModelShape, targets: list[str],
                  saved: list[str]) -> tuple[dict[tuple[int, str], tuple[str, str, str]], dict[str, tuple[int, ...]]]:
    """(layer, module) -> (A's name, B's name, the module's name for PEFT's patterns), experts' modules named
    ``experts.<parameter>``; and the tensors of modules saved whole (those ``saved`` names, as PEFT matches
    them: the module's path or its end) -> their shapes."""
    whole: dict[str, tuple[int, ...]] = {}
    parts: dict[tuple[int, str], dict[str, str]] = {}
    wrapped: dict[str, dict[int, dict[str, str]]] = {}  # experts module -> wrapper depth -> A/B -> key
    names: dict[tuple[int, str], str] = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                m = _KEY.match(key)
                if m is None and (w := _WHOLE.match(key)) and any(w[1] == n or w[1].endswith(f".{n}") for n in saved):
                    whole[key] = tuple(f.get_slice(key).get_shape())
                    continue
                experts = _WRAPPED_EXPERTS.match(m[1]) if m is not None else None
                if experts is not None:
                    wrapped.setdefault(experts[1], {}).setdefault(experts[2].count(".base_layer"), {})[m[2]] = key
                    continue
                if m is None:
                    raise InvalidArgument(f"{where}: tensor {key!r} is not a LoRA A/B weight of a decoder "
                                          f"layer's projection ({', '.join(MODULES)})")
                (layer, module), ab = _module(where, key, f"{m[1]}.weight", shape), m[2]
                fan_in, fan_out = shape.in_out(module, layer)
                rank = rank_of(m[1])
                want = (rank, fan_in) if ab == "A" else (fan_out, rank)
                got = tuple(f.get_slice(key).get_shape())
                if got != want:
                    raise InvalidArgument(f"{where}: {key} has shape {got}; this model needs {want} (an adapter "
                                          "for another base model?)")
                parts.setdefault((layer, module), {})[ab] = key
                names[layer, module] = m[1]
            for experts, by_depth in wrapped.items():
                for param, ab in _unwrapped(where, experts, by_depth, targets, shape):
                    layer = _check_experts(where, f"{experts}.{param}", param, ab, rank_of, shape, f)
                    parts[layer, f"experts.{param}"] = ab
                    names[layer, f"experts.{param}"] = f"{experts}.{param}"
    except OSError as exc:
        raise InvalidArgument(f"{where}: cannot read {WEIGHTS_FILE}: {exc.strerror or exc}") from None
    except InvalidArgument:
        raise
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise InvalidArgument(f"{where}: {WEIGHTS_FILE} is not a readable safetensors file: {exc}") from None
    _check_pairs(where, parts)
    return {k: (ab["A"], ab["B"], names[k]) for k, ab in sorted(parts.items())}, whole


def _check_pairs(where: str, parts: dict[tuple[int, str], dict[str, str]]) -> None:
    """Refuses an adapter without weights, or with a projection's A without its B, or one projection adapted
    twice (fused and as a part)."""
    half = [f"layer {layer} {module}" for (layer, module), ab in parts.items() if len(ab) != 2]
    if half:
        raise InvalidArgument(f"{where}: {half[0]} has only one of lora_A and lora_B")
    both = []
    for layer, module in parts:
        prefix = SHARED if module.startswith(SHARED) else ""
        both += [f"layer {layer}: {module} and {prefix}{part}" for part in PARTS.get(module.removeprefix(prefix), ())
                 if (layer, prefix + part) in parts]
    if both:
        raise InvalidArgument(f"{where}: adapts {both[0]}, the same projection twice")
    if not parts:
        raise InvalidArgument(f"{where}: {WEIGHTS_FILE} holds no LoRA weights")


def _unwrapped(where: str, experts: str, by_depth: dict[int, dict[str, str]], targets: list[str],
               shape: ModelShape) -> list[tuple[str, dict[str, str]]]:
    """Each adapted parameter of a stacked experts module with its A and B keys: the parameters
    ``target_parameters`` names, in the order the module registers them, innermost wrapper first."""
    params = ("gate_up_proj" if shape.gated_mlp else "up_proj", "down_proj")
    named = [p for p in params if any(f"{experts}.{p}" == t or f"{experts}.{p}".endswith(f".{t}") for t in targets)]
    if len(named) != len(by_depth):
        raise InvalidArgument(f"{where}: {len(by_depth)} parameters of {experts} adapted, but its config's "
                              f"target_parameters name {len(named)} of them ({', '.join(named) or 'none'})")
    return [(param, by_depth[depth]) for param, depth in zip(named, sorted(by_depth, reverse=True), strict=True)]


def _check_experts(where: str, name: str, param: str, ab: dict[str, str], rank_of: Callable[[str], int],
                   shape: ModelShape, f) -> int:
    """The layer of an adapter of a stacked expert projection, checked; raises ``InvalidArgument``."""
    found = shape.expert_param(name)
    if found is None:
        raise InvalidArgument(f"{where}: adapts {name}, not an MoE's stacked experts "
                              f"({', '.join(EXPERT_PARAMS)})")
    layer = found[0]
    if layer not in shape.moe_layers:
        raise InvalidArgument(f"{where}: adapts {name}; layer {layer} has no experts")
    if len(ab) != 2:
        raise InvalidArgument(f"{where}: {name} has only one of lora_A and lora_B")
    fan_in, fan_out = shape.expert_in_out(param)
    rows = rank_of(name) * shape.num_experts
    want = {"A": (rows, fan_in), "B": (fan_out, rows)}
    if shape.experts_swapped:
        want = {"A": (rows, fan_out), "B": (fan_in, rows)}
    for part, key in ab.items():
        if (got := tuple(f.get_slice(key).get_shape())) != want[part]:
            raise InvalidArgument(f"{where}: {key} has shape {got}; this model's {shape.num_experts} experts "
                                  f"need {want[part]} (an adapter for another base model?)")
    return layer
