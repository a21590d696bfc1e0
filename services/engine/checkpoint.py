"""A Hugging Face checkpoint directory without its weights: ``config.json``, ``tokenizer.json`` (or tiktoken
ranks, tiktoken_vocab.py) and ``generation_config.json`` (what the scheduler needs; ``loader.py`` adds the
weights). Imports no torch, so
the scheduler starts without it. Every failure names the file and the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from services.common.errors import ModelLoadError, NotFound
from services.common.sampling_params import GENERATION_CONFIG_FIELDS, generation_defaults
from services.engine.builtin_model import ensure_default_model
from services.engine.model_config import ModelConfig
from services.engine.pooling import Classifier, Pooling, has_lm_head, read_classifier, read_pooling
from services.engine.tiktoken_vocab import RANKS_FILE, load_tiktoken_dir


@dataclass
class Checkpoint:
    """A loaded model directory."""

    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]  # from generation_config.json when present, else config.json
    generation_defaults: dict
    pooling: Pooling = Pooling()  # what an embedding request returns (pooling.py)
    has_lm_head: bool = True  # False: an embedding model without an output head; it cannot generate
    classifier: Classifier | None = None  # a sequence classifier's classes (pooling.py); None: not one


def check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir).expanduser()
    if not path.exists():
        raise NotFound(f"model directory {str(path)!r} does not exist; pass --model DIR of a Hugging Face checkpoint "
                       "or omit it to use the built-in model")
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is not a directory; --model takes a checkpoint directory")
    return path


def load_checkpoint_meta(model_dir: str | Path, max_model_len: int | None = None) -> Checkpoint:
    """Everything but the weights (cheap: the scheduler and clients need only this); ``max_model_len`` caps the
    context served (--max-model-len)."""
    path = check_model_dir(model_dir)
    config = ModelConfig.from_dir(path).with_max_model_len(max_model_len)
    tokenizer = load_tokenizer(path)
    gen = read_json(path / "generation_config.json") if (path / "generation_config.json").exists() else {}
    eos = gen.get("eos_token_id", None)
    if eos is None:
        eos_ids = config.eos_token_ids
    else:
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return Checkpoint(path, config, tokenizer, eos_ids, gen, read_pooling(path, config.num_labels),
                      has_lm_head(path, config.tie_word_embeddings and not config.num_labels),
                      read_classifier(path, config.num_labels))


def load_tokenizer(path: Path) -> Tokenizer:
    """``tokenizer.json``, else the tiktoken ranks some checkpoints ship instead (Kimi K2)."""
    tok_path = path / "tokenizer.json"
    if not tok_path.exists():
        if (path / RANKS_FILE).exists():
            config_path = path / "tokenizer_config.json"
            return load_tiktoken_dir(path, read_json(config_path) if config_path.exists() else {})
        raise ModelLoadError(f"{path} has no tokenizer.json (a `tokenizers` file is required) and no {RANKS_FILE}")
    try:
        return Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ModelLoadError(f"{tok_path} cannot be read: {exc}") from exc


def resolve_model_dir(model: str | None) -> str:
    """The model directory to load: the given one, or the built-in model (created on first use)."""
    return model or str(ensure_default_model())


GENERATION_CONFIG_CHOICES = "auto (the model's generation_config.json), vllm (none) or a directory holding one"


def sampling_defaults(checkpoint: Checkpoint, source: str = "auto", override: dict | None = None) -> dict:
    """What requests leaving sampling fields out sample with (vLLM's ``--generation-config``): ``auto``, the
    checkpoint's ``generation_config.json``; ``vllm``, nothing (the API's own defaults); else a directory's
    ``generation_config.json``; ``override`` (vLLM's ``--override-generation-config``, the file's names) over it."""
    if source == "vllm":
        config: dict = {}
    elif source == "auto":
        config = checkpoint.generation_defaults
    else:
        path = Path(source).expanduser() / "generation_config.json"
        if not path.is_file():
            raise ModelLoadError(f"--generation-config {source!r}: no {path}; give {GENERATION_CONFIG_CHOICES}")
        config = read_json(path)
    return generation_defaults({**config, **(override or {})})


def generation_override(text: str) -> dict:
    """``--override-generation-config``'s JSON object of generation_config.json's sampling fields; a name it
    would not read is refused (a typo would otherwise change nothing, silently)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--override-generation-config is not JSON ({exc}); give an object such as "
                         '\'{"temperature": 0.5}\'') from None
    unknown = sorted(set(value) - set(GENERATION_CONFIG_FIELDS)) if isinstance(value, dict) else None
    if unknown is None or unknown:
        raise ValueError(f"--override-generation-config takes an object of {', '.join(GENERATION_CONFIG_FIELDS)}; got "
                         f"{', '.join(unknown) if unknown else repr(value)}")
    return value


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data
