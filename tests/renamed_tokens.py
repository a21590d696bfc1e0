"""The built-in model with some of its special tokens renamed to another family's markers (harmony's, Mistral's),
so that tests can make it write real special tokens those formats are read by."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def rename_tokens(tokenizer: dict, names: dict[int, str]) -> dict:
    """A ``tokenizer.json`` object with the added tokens of the ids in ``names`` renamed."""
    for token in tokenizer["added_tokens"]:
        token["content"] = names.get(token["id"], token["content"])
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = {k: i for k, i in vocab.items() if i not in names} | {n: i for i, n in names.items()}
    return tokenizer


def copy_with_renamed_tokens(model_dir: Path, out: Path, names: dict[int, str]) -> Path:
    """``model_dir`` copied to ``out`` with those tokens renamed in its tokenizer."""
    shutil.copytree(model_dir, out)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    (out / "tokenizer.json").write_text(json.dumps(rename_tokens(tokenizer, names)))
    return out
