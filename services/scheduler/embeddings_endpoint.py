"""OpenAI's embeddings API, ``POST /v1/embeddings``: each input's vector (services/engine/pooling.py), as floats or
base64 (little-endian float32, as OpenAI's clients decode it), cut to ``dimensions`` when asked. Inputs may be
text (tokenized as the model's tokenizer adds special tokens: embedding checkpoints append their pooled
token there) or token ids, one or a list; all run as one batch, queued all or none."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.common import tracing
from services.common.errors import InvalidArgument, SeawallError
from services.scheduler.http_io import error_response, json_body

_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "priority"}
_FORMATS = ("float", "base64")


class EmbeddingsEndpoint:
    def __init__(self, api) -> None:
        """``api``: the ``OpenAIApi`` whose frontend and model checks this shares."""
        self.api = api

    async def create(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            unknown = sorted(set(body) - _FIELDS)
            if unknown:
                raise InvalidArgument(f"unknown or unsupported fields: {', '.join(unknown)}; the embeddings API takes "
                                      f"{', '.join(sorted(_FIELDS))}")
            lora = self.api._check_model(body)
            fmt = body.get("encoding_format") or "float"
            if fmt not in _FORMATS:
                raise InvalidArgument(f"encoding_format must be one of {', '.join(_FORMATS)}, got {fmt!r}")
            if body.get("user") is not None and not isinstance(body["user"], str):
                raise InvalidArgument(f"user must be a string, got {body['user']!r}")
            priority = body.get("priority") or 0
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise InvalidArgument(f"priority must be an integer, got {priority!r}")
            prompts = self._inputs(body.get("input"))
            labels = [f"input[{i}]" if len(prompts) > 1 else "" for i in range(len(prompts))]
            vectors = await self.api.frontend.embed(prompts, body.get("dimensions"), tracing.extract(request.headers),
                                                    priority, lora, labels)
        except SeawallError as exc:
            return error_response(exc)
        tokens = sum(len(p) for p in prompts)
        return JSONResponse({
            "id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": self.api.served_name(body),
            "data": [{"object": "embedding", "index": i, "embedding": _encoded(v, fmt)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _inputs(self, value: Any) -> list[list[int]]:
        """OpenAI's input shapes: a string, a list of strings, a list of token ids, a list of such lists."""
        if isinstance(value, str) or _is_ids(value):
            value = [value]
        if not isinstance(value, list) or not value:
            raise InvalidArgument("input must be a string, a list of token ids, or a non-empty list of those")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                out.append(self.api.frontend.encode(item))
            elif _is_ids(item):
                out.append(list(item))
            else:
                raise InvalidArgument(f"input[{i}] must be a string or a list of token ids, got {item!r:.80}")
        return out


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in value)


def _encoded(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
