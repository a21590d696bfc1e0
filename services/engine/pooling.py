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


def read_pooling(path: Path, num_labels: int = 0) -> Pooling:
    """The checkpoint's pooling: from its sentence-transformers ``modules.json`` when present, else last token,
    normalized; a classifier's (``num_labels``) pooled state is its classes' scores, not an embedding."""
    if num_labels:
        return Pooling(False, "it is a sequence classifier: it serves /classify (and, with one label, /score and "
                              "/rerank as a cross-encoder), not embeddings")
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


@dataclass(frozen=True)
class Classifier:
    """A sequence-classification checkpoint's head, as the API reports it: each class's label, and how its logits
    become scores (transformers' ``problem_type``: softmax across single-label classes, sigmoid for multi-label
    ones or a single class, as vLLM scores them; regression keeps the logits)."""

    labels: tuple[str, ...]
    activation: str  # "softmax", "sigmoid" or "identity"

    def label(self, logits: list[float]) -> str:
        """The best class's label."""
        return self.labels[max(range(len(logits)), key=logits.__getitem__)]

    def scores(self, logits: list[float]) -> list[float]:
        if self.activation == "identity":
            return list(logits)
        if self.activation == "sigmoid":
            return [_sigmoid(x) for x in logits]
        top = max(logits)
        exps = [math.exp(x - top) for x in logits]
        total = math.fsum(exps)
        return [e / total for e in exps]


def read_classifier(path: Path, num_labels: int) -> Classifier | None:
    """A classifier's labels (``id2label``, else ``LABEL_i`` as transformers names them) and activation, from its
    ``config.json``; None for a checkpoint that is not one (``num_labels`` 0)."""
    if not num_labels:
        return None
    config = read_json(path / "config.json")
    id2label = config.get("id2label") if isinstance(config.get("id2label"), dict) else {}
    labels = tuple(str(id2label.get(str(i), f"LABEL_{i}")) for i in range(num_labels))
    problem = config.get("problem_type")
    activation = ("identity" if problem == "regression" else
                  "sigmoid" if problem == "multi_label_classification" or num_labels == 1 else "softmax")
    return Classifier(labels, activation)


def check_classifier(classifier: Classifier | None) -> Classifier:
    """The checkpoint's classifier; raises InvalidArgument when it has none."""
    if classifier is None:
        raise InvalidArgument("this model is not a sequence classifier (its architecture is not ...ForSequence"
                              "Classification): it has no classes to score; use /v1/embeddings or generation")
    return classifier


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
