"""What an embedding request (SamplingParams.pooling) returns for a checkpoint, and whether the checkpoint can
generate at all. No torch: the scheduler reads this beside the config.

An embedding is the final hidden state (after the model's last norm) of the prompt's last token, L2-normalized:
how decoder embedding models pool (Qwen3-Embedding, gte-Qwen2, e5-mistral) and vLLM's default for them. A
checkpoint that ships sentence-transformers' files says it for itself: ``modules.json`` lists a ``Pooling``
module (whose ``config.json`` must pool the last token) and, when the vectors are normalized, a ``Normalize``
one. Other poolings (mean, CLS) and layers after pooling (``Dense``) are not computed: embedding requests to
such a checkpoint are refused, saying so; it still generates.

Embedding checkpoints saved from a base model (``Qwen3Model``) store no ``lm_head``: such a checkpoint serves
embeddings only (``has_lm_head``), and a request to generate from it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import InvalidArgument, ModelLoadError
from services.common.sampling_params import SamplingParams
from services.engine.safetensors_headers import read_json, tensors

_LAST_TOKEN = "pooling_mode_lasttoken"
_OTHER_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


@dataclass(frozen=True)
class Pooling:
    normalize: bool = True  # L2-normalize each vector (sentence-transformers' Normalize module)
    refused: str = ""  # why this checkpoint's embeddings are not served; "" when they are


# What every embedding request runs with: one "token", which the worker replaces by the hidden state.
EMBEDDING_PARAMS = SamplingParams(max_tokens=1, temperature=0.0, pooling=True)


def check_embedding(pooling: Pooling, hidden_size: int, dimensions: int | None) -> None:
    """Raises InvalidArgument when the checkpoint's embeddings are not served or ``dimensions`` cannot be cut."""
    if pooling.refused:
        raise InvalidArgument(f"this model's embeddings are not served: {pooling.refused}")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or not 1 <= dimensions <= hidden_size):
        raise InvalidArgument(f"dimensions must be an integer from 1 to the model's {hidden_size}, got {dimensions!r}")


def check_generates(has_lm_head: bool, params: SamplingParams) -> None:
    """Raises InvalidArgument for a request to generate from a checkpoint without an output head."""
    if not has_lm_head and not params.pooling:
        raise InvalidArgument("this model is an embedding model (its checkpoint has no output head): it serves "
                              "embeddings (/v1/embeddings, Embed), not generation")


def embedding_vector(hidden: list[float], pooling: Pooling, dimensions: int | None = None) -> list[float]:
    """The vector a client gets from a worker's hidden state: its first ``dimensions`` features (Matryoshka
    truncation; None: all), then L2-normalized when the checkpoint normalizes."""
    vector = hidden[:dimensions] if dimensions is not None else hidden
    if not pooling.normalize:
        return list(vector)
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return [v / max(norm, 1e-12) for v in vector]  # torch.nn.functional.normalize's floor on the norm


def read_pooling(path: Path) -> Pooling:
    """The checkpoint's pooling: from its sentence-transformers ``modules.json`` when present, else last token,
    normalized."""
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return Pooling()
    modules = read_json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelLoadError(f"{modules_file} must list sentence-transformers modules (objects with a type)")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    normalize = "Normalize" in kinds
    extra = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if extra:
        return Pooling(normalize, f"its sentence-transformers modules include {', '.join(extra)} after pooling, "
                                  "which Seawall does not compute")
    pooling = next((m for m, k in zip(modules, kinds, strict=True) if k == "Pooling"), None)
    if pooling is None:
        return Pooling(normalize)
    config_file = path / str(pooling.get("path", "")) / "config.json"
    config = read_json(config_file) if config_file.exists() else {}
    others = [m.removeprefix("pooling_mode_") for m in _OTHER_MODES if config.get(m)]
    if others or not config.get(_LAST_TOKEN):
        return Pooling(normalize, f"it pools by {', '.join(others) or 'a mode not named'} "
                                  f"({config_file.relative_to(path)}); last-token pooling is supported")
    return Pooling(normalize)


def has_lm_head(path: Path, tied: bool) -> bool:
    """Whether the checkpoint can generate: its output head tied to the embeddings, or stored (``*lm_head.weight``,
    GPT-NeoX's ``embed_out.weight``, among its tensors, read from the safetensors index or headers, not the
    tensors)."""
    return tied or any(name.endswith(("lm_head.weight", "embed_out.weight")) for name in _tensor_names(path))


def _tensor_names(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    if index.exists():  # the index names them all: no header read
        index_json = read_json(index)
        weight_map = index_json.get("weight_map") if isinstance(index_json, dict) else None
        return list(weight_map) if isinstance(weight_map, dict) else []
    return [name for name, _ in tensors(path)]
