"""vLLM's runtime LoRA endpoints: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, served only
with ``--allow-runtime-lora-updating`` (they make the mesh read any directory a client names)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from services.common.errors import InvalidArgument, SeawallError
from services.scheduler.http_io import error_response, json_body
from services.scheduler.lora_registry import LoraRegistry


class LoraEndpoints:
    def __init__(self, loras: LoraRegistry) -> None:
        self.loras = loras

    async def load(self, request: Request) -> Response:
        """``{"lora_name", "lora_path"}``: checks the adapter against the model and serves it under that name."""
        try:
            body = await json_body(request)
            name, path = _text(body, "lora_name"), _text(body, "lora_path")
            self.loras.add(name, path)
        except SeawallError as exc:
            return error_response(exc)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: Request) -> Response:
        """``{"lora_name"}``: refuses new requests for it; running ones finish with it."""
        try:
            body = await json_body(request)
            name = _text(body, "lora_name")
            self.loras.remove(name)
        except SeawallError as exc:
            return error_response(exc)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _text(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{key} must be a non-empty string, got {value!r}")
    return value
