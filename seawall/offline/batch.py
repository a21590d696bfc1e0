"""OpenAI batch files (as ``vllm run-batch``): parse request lines, run them together, write response lines.

Input line:  ``{"custom_id", "method": "POST", "url": "/v1/completions", "body": {"prompt": str | [int], ...}}``
Output line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` — the body is
an OpenAI completion whose choice also carries ``token_ids`` (vLLM's ``return_token_ids``). A bad line gets
status 400 and a message; the other lines still run.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from seawall.offline.engine import Completion, OfflineEngine
from services.common.errors import InvalidArgument, SeawallError
from services.common.openai_logprobs import TokenTexts, completion_logprobs
from services.common.sampling_params import SamplingParams

SUPPORTED_URLS = ("/v1/completions",)


@dataclass
class BatchItem:
    line_no: int
    custom_id: str | None
    prompt_token_ids: list[int] | None = None
    params: SamplingParams | None = None
    error: SeawallError | None = None


def parse_line(engine: OfflineEngine, line_no: int, line: str) -> BatchItem:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        return BatchItem(line_no, None, error=InvalidArgument(f"line {line_no} is not valid JSON: {exc.msg}"))
    if not isinstance(raw, dict):
        return BatchItem(line_no, None, error=InvalidArgument(f"line {line_no} must be a JSON object"))
    item = BatchItem(line_no, raw.get("custom_id"))
    try:
        item.prompt_token_ids, item.params = _parse_request(engine, raw)
        engine.validate(item.prompt_token_ids, item.params)
    except SeawallError as exc:
        item.error = exc
    return item


def _parse_request(engine: OfflineEngine, raw: dict[str, Any]) -> tuple[list[int], SamplingParams]:
    if raw.get("method", "POST") != "POST":
        raise InvalidArgument(f"method must be POST, got {raw.get('method')!r}")
    if raw.get("url") not in SUPPORTED_URLS:
        raise InvalidArgument(f"url must be one of {', '.join(SUPPORTED_URLS)}, got {raw.get('url')!r}")
    body = raw.get("body")
    if not isinstance(body, dict):
        raise InvalidArgument("body must be a JSON object holding the completion request")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = engine.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise InvalidArgument("body.prompt must be a string or a list of token ids (one prompt per line)")
    return ids, SamplingParams.from_openai(body)


def run_batch(engine: OfflineEngine, lines: list[str], model_name: str) -> list[dict[str, Any]]:
    items = [parse_line(engine, i + 1, line) for i, line in enumerate(lines) if line.strip()]
    good = [it for it in items if it.error is None]
    completions = engine.generate([it.prompt_token_ids for it in good], [it.params for it in good])
    by_line = {it.line_no: c for it, c in zip(good, completions, strict=True)}
    created = int(time.time())
    out = []
    for it in items:
        if it.error is not None:
            out.append(_error_line(it, it.error))
        else:
            out.append(_response_line(it, by_line[it.line_no], engine, model_name, created))
    return out


def _response_line(item: BatchItem, comp: Completion, engine: OfflineEngine, model: str, created: int) -> dict:
    request_id = f"cmpl-{uuid.uuid4().hex}"
    choice = {
        "index": 0,
        "text": comp.text,
        "logprobs": (completion_logprobs(comp.logprobs, TokenTexts(engine.tokenizer))
                     if item.params.logprobs is not None else None),
        "finish_reason": comp.finish_reason,
        "token_ids": comp.token_ids,
    }
    body = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(comp.prompt_token_ids),
            "completion_tokens": len(comp.token_ids),
            "total_tokens": len(comp.prompt_token_ids) + len(comp.token_ids),
            "prompt_tokens_details": {"cached_tokens": comp.num_cached_prompt_tokens},
        },
    }
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": item.custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None}


def _error_line(item: BatchItem, error: SeawallError) -> dict:
    message = str(error)
    status = error.http_status
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": item.custom_id,
            "response": {"status_code": status, "request_id": None,
                         "body": {"error": {"message": message, "type": "invalid_request_error",
                                            "code": error.grpc_code.lower()}}},
            "error": {"code": error.grpc_code.lower(), "message": message}}
