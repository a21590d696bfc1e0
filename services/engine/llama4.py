"""Llama 4's text model (Scout, Maverick: ``Llama4ForCausalLM``, and the language model of
``Llama4ForConditionalGeneration``): what sets it apart from Llama, read from its config as transformers reads
it, and its checkpoints' layout. No torch at import (the scheduler reads configs).

* RoPE layers (three of every four by default) rotate interleaved pairs and attend within chunks of
  ``attention_chunk_size`` positions: a query sees the keys from the start of its chunk to itself. The other
  layers have no RoPE and attend to everything; with ``attn_temperature_tuning`` their queries are scaled up
  with position, ``1 + attn_scale * log(1 + floor((p + 1) / floor_scale))``, to keep attention over a long
  context sharp.
* With ``use_qk_norm``, a RoPE layer's q and k are L2-normed per head after rotation (no weight).
* Mixture-of-experts layers (every ``interleave_moe_layer_step``-th, or ``moe_layers``) route each token to
  its top-k experts by logit; the sigmoid of the logit scales the token going *into* its expert (moe.py,
  routing "sigmoid_input"), and a shared expert as wide adds its output. Dense layers are
  ``intermediate_size_mlp`` wide.
* Checkpoints hold the MLP under ``feed_forward`` and the router as ``router``; the experts are stacked as
  ``x @ w`` operands (``[experts, hidden, 2 * intermediate]``, ``[experts, intermediate, hidden]``), which
  load transposed into the linear weights moe.py holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

ARCH = "Llama4ForCausalLM"
RENAMES = ((".feed_forward.router.", ".mlp.gate."), (".feed_forward.", ".mlp."))
_STACKED = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def llama4_fields(raw: dict[str, Any], layers: int) -> dict[str, Any]:
    """The ``ModelConfig`` fields of Llama 4's attention (its NoPE layers: ``llama4_nope_layers``; its
    interleaved RoPE and dense width: ``ModelConfig.from_dict``)."""
    nope = llama4_nope_layers(raw, layers)
    chunk = raw.get("attention_chunk_size", 8192)
    types = raw.get("layer_types")
    if types is None:
        chunked = () if chunk is None else tuple(i for i in range(layers) if i not in nope)
    elif not (isinstance(types, list) and len(types) == layers
              and set(types) <= {"chunked_attention", "full_attention"}):
        raise ModelLoadError(f"config.json: layer_types must give chunked_attention or full_attention for each of "
                             f"the {layers} layers")
    else:
        chunked = tuple(i for i, kind in enumerate(types) if kind == "chunked_attention")
    if chunked and (chunk is None or int(chunk) < 1):
        raise ModelLoadError(f"config.json: chunked attention layers need attention_chunk_size >= 1, got {chunk}")
    tuning = raw.get("attn_temperature_tuning", True)
    return dict(attention_chunk=int(chunk) if chunked else None, chunked_layers=chunked,
                qk_l2_norm=bool(raw.get("use_qk_norm", True)),
                nope_temperature=(float(raw.get("floor_scale", 8192)), float(raw.get("attn_scale", 0.1)))
                if tuning else None)


def llama4_nope_layers(raw: dict[str, Any], layers: int) -> tuple[int, ...]:
    """``no_rope_layers`` (1 = RoPE, 0 = none, per layer); when absent or empty, every
    ``no_rope_layer_interval``-th layer (default 4) has none."""
    flags = raw.get("no_rope_layers")
    if not flags:
        interval = int(raw.get("no_rope_layer_interval") or 4)
        return tuple(i for i in range(layers) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) != layers:
        raise ModelLoadError(f"config.json: no_rope_layers must give one 0 or 1 per layer ({layers})")
    return tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)


def llama4_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A Llama 4 checkpoint's tensors under the names (and in the orientation) the model holds them."""
    for name, tensor in weights:
        for old, new in RENAMES:
            name = name.replace(old, new)
        if name.endswith(_STACKED):
            tensor = tensor.transpose(1, 2)
        yield name, tensor
