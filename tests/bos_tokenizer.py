"""A checkpoint's tokenizer made to add a BOS token to every text it encodes, as Llama's, Gemma's and Mistral's
do (the built-in model's adds none): what shows whether a chat prompt gets the template's BOS once or twice."""

from __future__ import annotations

import json
from pathlib import Path


def add_bos_to_every_text(checkpoint: Path) -> int:
    """Rewrites ``checkpoint``'s tokenizer.json with a post-processor that puts its config's ``bos_token`` first;
    returns that token's id."""
    path = checkpoint / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    bos = json.loads((checkpoint / "tokenizer_config.json").read_text())["bos_token"]
    bos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == bos)
    first = {"SpecialToken": {"id": bos, "type_id": 0}}
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [first, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    path.write_text(json.dumps(tokenizer))
    return bos_id
