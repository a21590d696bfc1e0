"""OpenAI's embeddings API, ``POST /v1/embeddings``: each input's vector (services/engine/pooling.py), as floats or
base64 (little-endian float32, as OpenAI's clients decode it), cut to ``dimensions`` when asked. Inputs may be
text (tokenized as the model's tokenizer adds special tokens: embedding checkpoints append their pooled
token there) or token ids, one or a list; all run as one batch, queued all or none.

And what vLLM computes from embeddings for retrieval: ``POST /score`` (``text_1`` against each ``text_2``, or
pairwise) and ``POST /rerank`` (Jina's and Cohere's shape: ``query``, ``documents``, ``top_n``), each score the
cosine similarity of the two vectors, as vLLM scores with an embedding model; with a one-class sequence
classifier, the cross-encoder's score of each pair instead (classify_endpoint.py)."""

from __future__ import annotations

import base64
import math
import struct
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.common import tracing
from services.common.errors import InvalidArgument, SeawallError
from services.scheduler.http_io import error_response, json_body, request_priority

_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "priority"}
_SCORE_FIELDS = {"model", "text_1", "text_2", "user", "priority"}
_RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "user", "priority"}
_FORMATS = ("float", "base64")


class EmbeddingsEndpoint:
    def __init__(self, api, cross_encoder=None) -> None:
        """``api``: the ``OpenAIApi`` whose frontend and model checks this shares; ``cross_encoder(body, request,
        pairs)``: the scores of (query, document) pairs and their tokens, for a classifier checkpoint
        (classify_endpoint.py), which scores pairs instead of comparing embeddings."""
        self.api = api
        self.cross_encoder = cross_encoder

    async def create(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            _check_fields(body, _FIELDS, "the embeddings API")
            lora = self.api._check_model(body)
            fmt = body.get("encoding_format") or "float"
            if fmt not in _FORMATS:
                raise InvalidArgument(f"encoding_format must be one of {', '.join(_FORMATS)}, got {fmt!r}")
            if body.get("user") is not None and not isinstance(body["user"], str):
                raise InvalidArgument(f"user must be a string, got {body['user']!r}")
            priority = request_priority(body)
            prompts = input_prompts(self.api.frontend, body.get("input"))
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

    async def score(self, request: Request) -> Response:
        """vLLM's ``/score``: ``text_1`` (one text, or a list as long as ``text_2``) against ``text_2``."""
        try:
            body = await json_body(request)
            _check_fields(body, _SCORE_FIELDS, "the score API")
            first, second = _texts(body.get("text_1"), "text_1"), _texts(body.get("text_2"), "text_2")
            if len(first) != 1 and len(first) != len(second):
                raise InvalidArgument(f"text_1 must be one text or as many as text_2 ({len(second)}), got {len(first)}")
            pairs = [(0 if len(first) == 1 else i, len(first) + i) for i in range(len(second))]
            texts = first + second
            if self.cross_encoder is not None:
                scores, tokens = await self.cross_encoder(body, request, [(texts[a], texts[b]) for a, b in pairs])
            else:
                vectors, tokens = await self._embed(body, request, texts)
                scores = [_cosine(vectors[a], vectors[b]) for a, b in pairs]
        except SeawallError as exc:
            return error_response(exc)
        return JSONResponse({
            "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": self.api.served_name(body),
            "data": [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, request: Request) -> Response:
        """Jina's and Cohere's ``/rerank``: the documents by their score against the query, best first."""
        try:
            body = await json_body(request)
            _check_fields(body, _RERANK_FIELDS, "the rerank API")
            query = body.get("query")
            if not isinstance(query, str) or not query:
                raise InvalidArgument(f"query must be a non-empty string, got {query!r:.80}")
            texts = _documents(body.get("documents"))
            top_n = len(texts) if body.get("top_n") is None else body["top_n"]
            if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
                raise InvalidArgument(f"top_n must be an integer >= 1, got {top_n!r}")
            keep_text = body.get("return_documents", True)
            if not isinstance(keep_text, bool):
                raise InvalidArgument(f"return_documents must be true or false, got {keep_text!r}")
            if self.cross_encoder is not None:
                pair_scores, tokens = await self.cross_encoder(body, request, [(query, t) for t in texts])
            else:
                vectors, tokens = await self._embed(body, request, [query, *texts])
                pair_scores = [_cosine(vectors[0], vectors[i + 1]) for i in range(len(texts))]
        except SeawallError as exc:
            return error_response(exc)
        scores = sorted(((score, i) for i, score in enumerate(pair_scores)), key=lambda p: -p[0])
        return JSONResponse({
            "id": f"rerank-{uuid.uuid4().hex}", "model": self.api.served_name(body), "usage": {"total_tokens": tokens},
            "results": [{"index": i, "relevance_score": score, **({"document": {"text": texts[i]}} if keep_text else {})}
                        for score, i in scores[:top_n]]})

    async def _embed(self, body: dict, request: Request, texts: list[str]) -> tuple[list[list[float]], int]:
        """The texts' vectors, one batch queued all or none, and their tokens."""
        lora = self.api._check_model(body)
        priority = request_priority(body)
        prompts = [self.api.frontend.encode(t) for t in texts]
        vectors = await self.api.frontend.embed(prompts, None, tracing.extract(request.headers), priority, lora)
        return vectors, sum(map(len, prompts))


def input_prompts(frontend, value: Any) -> list[list[int]]:
    """OpenAI's input shapes as prompts: a string, a list of strings, a list of token ids, a list of such lists."""
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidArgument("input must be a string, a list of token ids, or a non-empty list of those")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(frontend.encode(item))
        elif _is_ids(item):
            out.append(list(item))
        else:
            raise InvalidArgument(f"input[{i}] must be a string or a list of token ids, got {item!r:.80}")
    return out


def _check_fields(body: dict, allowed: set[str], api: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidArgument(f"unknown or unsupported fields: {', '.join(unknown)}; {api} takes {', '.join(sorted(allowed))}")


def _texts(value: Any, name: str) -> list[str]:
    """One text or a non-empty list of texts."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        raise InvalidArgument(f"{name} must be a string or a non-empty list of strings, got {value!r:.80}")
    return value


def _documents(value: Any) -> list[str]:
    """Rerank's documents: a non-empty list of strings or of Cohere's ``{"text": ...}`` objects (a string alone is
    not a list of documents: iterating it would rank its characters)."""
    if not isinstance(value, list) or not value:
        raise InvalidArgument(f"documents must be a non-empty list of strings (or {{\"text\": ...}} objects), got "
                              f"{value!r:.80}")
    texts = [d.get("text") if isinstance(d, dict) else d for d in value]
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise InvalidArgument(f"documents[{bad}] must be a string or {{\"text\": a string}}, got {value[bad]!r:.80}")
    return texts


def _cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    return dot / max(math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b)), 1e-12)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in value)


def _encoded(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
