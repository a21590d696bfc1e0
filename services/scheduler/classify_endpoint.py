"""vLLM's classification API, ``POST /classify``: a sequence classifier's classes for each input (a reward model,
a content classifier: ``...ForSequenceClassification`` checkpoints, pooling.py ``Classifier``), each with its
label, the scores of every class (softmax, or sigmoid for multi-label and single-class heads, as vLLM scores
them) and, Seawall's addition, the raw logits (a reward model's reward). And the cross-encoder scores that
``/score`` and ``/rerank`` give with a one-class classifier: each (query, document) pair tokenized as the
tokenizer joins a pair, as transformers' ``tokenizer(query, document)`` does, scored by its class's sigmoid."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.common import tracing
from services.common.errors import InvalidArgument, SeawallError
from services.engine.pooling import check_classifier
from services.scheduler.embeddings_endpoint import input_prompts
from services.scheduler.http_io import error_response, json_body, request_priority

if TYPE_CHECKING:
    from services.scheduler.http_api import OpenAIApi

_FIELDS = {"model", "input", "user", "priority"}


class ClassifyEndpoint:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api

    async def create(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            unknown = sorted(set(body) - _FIELDS)
            if unknown:
                raise InvalidArgument(f"unknown or unsupported fields: {', '.join(unknown)}; the classification API "
                                      f"takes {', '.join(sorted(_FIELDS))}")
            lora = self.api._check_model(body)
            classifier = check_classifier(self.api.frontend.checkpoint.classifier)
            prompts = input_prompts(self.api.frontend, body.get("input"))  # the embeddings API's shapes
            labels = [f"input[{i}]" if len(prompts) > 1 else "" for i in range(len(prompts))]
            logits = await self.api.frontend.classify(prompts, tracing.extract(request.headers),
                                                      request_priority(body), lora, labels)
        except SeawallError as exc:
            return error_response(exc)
        data = [{"index": i, "label": classifier.label(row), "probs": classifier.scores(row), "num_classes": len(row),
                 "logits": row} for i, row in enumerate(logits)]
        tokens = sum(len(p) for p in prompts)
        return JSONResponse({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                             "model": self.api.served_name(body), "data": data,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def pair_scores(self, body: dict, request: Request, pairs: list[tuple[str, str]]) -> tuple[list[float], int]:
        """A one-class classifier's score of each (query, document) pair, and the tokens they took."""
        classifier = check_classifier(self.api.frontend.checkpoint.classifier)
        if len(classifier.labels) != 1:
            raise InvalidArgument(f"this classifier has {len(classifier.labels)} classes; scoring pairs needs a "
                                  "cross-encoder (one class): use /classify for its classes")
        tokenizer = self.api.frontend.tokenizer
        prompts = [tokenizer.encode(a, b).ids for a, b in pairs]
        logits = await self.api.frontend.classify(prompts, tracing.extract(request.headers), request_priority(body),
                                                  self.api._check_model(body))
        return [classifier.scores(row)[0] for row in logits], sum(map(len, prompts))
