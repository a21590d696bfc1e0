"""A checkpoint's tensors as its safetensors headers describe them (names, shapes, dtypes), without reading a
tensor or importing torch: what the scheduler and ``seawall model check`` need to know about weights."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.common.errors import ModelLoadError


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index names, else every one in the directory."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        index_json = read_json(index)
        weight_map = index_json.get("weight_map") if isinstance(index_json, dict) else None
        return sorted({path / f for f in weight_map.values()}) if isinstance(weight_map, dict) else []
    return sorted(path.glob("*.safetensors"))


def tensors(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, {"dtype", "shape", ...}) of every tensor in the checkpoint's files."""
    for file in weight_files(path):
        for name, info in header(file).items():
            if name != "__metadata__":
                yield name, info


def header(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as exc:
        raise ModelLoadError(f"{file} is not a readable safetensors file: {exc}") from exc


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not readable JSON: {exc}") from exc
