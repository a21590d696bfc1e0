"""The LoRA adapters the mesh serves, by the name clients put in a request's ``model`` field.

Adapters are checked against the base model here, once, when they are added (``--lora-modules`` at start, or
``POST /v1/load_lora_adapter``); requests then carry the adapter's name and directory to the workers, which
load it on first use (services/engine/lora.py). Removing one refuses new requests for it; requests already
running keep it to the end (their workers hold it).
"""

from __future__ import annotations

from collections.abc import Iterator

from services.common.errors import InvalidArgument, NotFound
from services.common.lora import LoraSpec, activation_start, check_name, read_lora
from services.common.lora_shape import ModelShape
from services.common.step import LoraRef


class LoraRegistry:
    def __init__(self, shape: ModelShape, max_rank: int, base_names: tuple[str, ...]) -> None:
        """``base_names``: what the ``model`` field may say for the base model (its served name and path)."""
        self.shape, self.max_rank, self.base_names = shape, max_rank, base_names
        self._specs: dict[str, LoraSpec] = {}

    def add(self, name: str, path: str) -> LoraSpec:
        """Checks and serves the adapter at ``path`` as ``name``; raises ``InvalidArgument`` saying why not."""
        check_name(name)
        if name in self.base_names:
            raise InvalidArgument(f"LoRA name {name!r} is the base model's name; choose another")
        if name in self._specs:
            raise InvalidArgument(f"a LoRA adapter named {name!r} is already loaded (from "
                                  f"{self._specs[name].ref.path}); unload it first or choose another name")
        spec = self._specs[name] = read_lora(LoraRef(name, path), self.shape, self.max_rank)
        return spec

    def remove(self, name: str) -> None:
        if self._specs.pop(name, None) is None:
            raise NotFound(f"no LoRA adapter named {name!r} is loaded")

    def resolve(self, model: object) -> LoraRef | None:
        """The adapter a request's ``model`` field names, or None for the base model (None, empty, or one of
        its names); raises ``NotFound`` saying what is served, ``InvalidArgument`` for what is no name."""
        if model is not None and not isinstance(model, str):
            raise InvalidArgument(f"model must be a string, got {model!r}")
        if not model or model in self.base_names:
            return None
        spec = self._specs.get(model)
        if spec is None:
            served = ", ".join(repr(n) for n in (self.base_names[0], *self._specs))
            raise NotFound(f"the model {model!r} does not exist here; this server serves {served} (GET /v1/models)")
        return spec.ref

    def activation_start(self, ref: LoraRef | None, prompt: list[int]) -> int | None:
        """Where ``ref`` applies from in ``prompt`` (services/common/lora.py); 0 for the base model and for a
        plain adapter."""
        spec = self._specs.get(ref.name) if ref is not None else None
        return activation_start(prompt, spec.invocation_tokens) if spec is not None else 0

    def __iter__(self) -> Iterator[LoraSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)
