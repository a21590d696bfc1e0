"""OpenAI batch files (as ``vllm run-batch``): parse request lines, run them together, write response lines.

Input line:  ``{"custom_id", "method": "POST", "url": "/v1/completions", "body": {"prompt": str | [int], ...}}``, or
``"url": "/v1/chat/completions"`` with ``"body": {"messages": [...], ...}`` (rendered by the chat template; tool
calls are the live API's)
Output line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` — the body is
an OpenAI completion whose choices also carry ``token_ids`` (vLLM's ``return_token_ids``); ``n`` choices
(seeded ones with ``seed + j``) and ``echo`` (with ``logprobs``: the prompt's tokens scored) as the HTTP API
has them; ``use_beam_search`` (``n`` beams, ``length_penalty``, ``early_stopping``) returns the beams as the
choices, best first; ``body.model`` names a LoRA adapter (``--lora-modules``) or the base model. A bad line gets status 400 and a message, as does one whose request fails while it runs (constraints
that leave no token possible); the other lines still run.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from seawall.offline.engine import Completion, OfflineEngine
from services.common.beam_search import BeamParams, beam_from_openai, hypothesis_text
from services.common.errors import InvalidArgument, SeawallError
from services.common.openai_logprobs import (
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    echoed_completion_logprobs,
    vllm_prompt_logprobs,
)
from services.common.sampling_params import (
    SamplingParams,
    bool_field,
    from_openai_completion,
    prompt_truncation,
    with_defaults,
)
from services.common.step import LoraRef
from services.scheduler.admission import check_cache_salt, room
from services.scheduler.chat_prompt import ChatPrompt, chat_sampling
from services.scheduler.lora_registry import LoraRegistry

SUPPORTED_URLS = ("/v1/completions", "/v1/chat/completions")


@dataclass
class BatchItem:
    line_no: int
    custom_id: str | None
    prompt_token_ids: list[int] | None = None
    params: SamplingParams | None = None
    error: SeawallError | None = None
    n: int = 1
    echo: str | None = None  # with ``echo``, the prompt text each choice starts with
    prompt_scores: bool = False  # ``prompt_logprobs`` asked for: choices carry them, as vLLM's do
    lora: LoraRef | None = None  # the adapter body.model names; None = the base model
    cache_salt: str = ""  # body.cache_salt: only lines with the same salt share cached KV
    beam: BeamParams | None = None  # body.use_beam_search: n beams, each a choice
    chat: bool = False  # a /v1/chat/completions line: its choices are messages
    as_ids: bool = False  # body.return_tokens_as_token_ids: logprobs name tokens "token_id:ID"


def parse_line(engine: OfflineEngine, line_no: int, line: str, loras: LoraRegistry,
               chat: ChatPrompt | None = None, defaults: dict | None = None) -> BatchItem:
    """``defaults``: the sampling fields a line leaves out (``sampling_params.generation_defaults``)."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        return BatchItem(line_no, None, error=InvalidArgument(f"line {line_no} is not valid JSON: {exc.msg}"))
    if not isinstance(raw, dict):
        return BatchItem(line_no, None, error=InvalidArgument(f"line {line_no} must be a JSON object"))
    item = BatchItem(line_no, raw.get("custom_id"))
    try:
        _parse_request(engine, raw, item, chat, defaults or {})
        item.lora = loras.resolve(raw["body"].get("model"))
        item.cache_salt = check_cache_salt(raw["body"].get("cache_salt"))
        engine.validate(item.prompt_token_ids, item.params)
    except SeawallError as exc:
        item.error = exc
    return item


def _parse_request(engine: OfflineEngine, raw: dict[str, Any], item: BatchItem, chat: ChatPrompt | None,
                   defaults: dict) -> None:
    if raw.get("method", "POST") != "POST":
        raise InvalidArgument(f"method must be POST, got {raw.get('method')!r}")
    if raw.get("url") not in SUPPORTED_URLS:
        raise InvalidArgument(f"url must be one of {', '.join(SUPPORTED_URLS)}, got {raw.get('url')!r}")
    body = raw.get("body")
    if not isinstance(body, dict):
        raise InvalidArgument("body must be a JSON object holding the completion request")
    item.as_ids = bool_field(body, "return_tokens_as_token_ids")
    if raw["url"] == "/v1/chat/completions":
        _parse_chat(engine, body, item, chat or ChatPrompt(engine.checkpoint.path, engine.encode), defaults)
        return
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = engine.encode(prompt, bool_field(body, "add_special_tokens", default=True))
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise InvalidArgument("body.prompt must be a string or a list of token ids (one prompt per line)")
    item.params, item.n, echo = from_openai_completion(with_defaults(body, defaults))
    keep = prompt_truncation(body, engine.scheduler.config.max_model_len)
    if keep is not None and len(ids) > keep:
        ids, prompt = ids[-keep:], None  # echoed as what ran: its tokens decoded
    if echo:
        item.echo = prompt if isinstance(prompt, str) else engine.tokenizer.decode(ids, skip_special_tokens=False)
    item.prompt_token_ids = ids
    item.prompt_scores = body.get("prompt_logprobs") is not None
    item.beam = beam_from_openai(body, item.params, item.n, engine.checkpoint.eos_token_ids,
                                 engine.scheduler.config.max_model_len - len(ids))


def _parse_chat(engine: OfflineEngine, body: dict[str, Any], item: BatchItem, chat: ChatPrompt,
                defaults: dict) -> None:
    """A chat completions line: its messages rendered by the chat template; tool calls are the live API's."""
    if body.get("tools") or body.get("tool_choice") not in (None, "none"):
        raise InvalidArgument("tools are not supported in run-batch: send the request to the HTTP API (seawall up) "
                              "or leave tools out")
    if body.get("stream"):
        raise InvalidArgument("stream cannot be used in run-batch: each line's response is written whole")
    ids = chat.render(body)
    keep = prompt_truncation(body, engine.scheduler.config.max_model_len)
    item.prompt_token_ids = ids[-keep:] if keep is not None else ids
    config, block_size = engine.scheduler.config, engine.blocks.block_size
    pool = engine.blocks.num_blocks * block_size if config.window_blocks(block_size) is None else None
    item.params, item.n = chat_sampling(with_defaults(body, defaults),
                                        room(len(item.prompt_token_ids), config.max_model_len, pool))
    item.chat = True
    item.beam = beam_from_openai(body, item.params, item.n, engine.checkpoint.eos_token_ids,
                                 engine.scheduler.config.max_model_len - len(item.prompt_token_ids))


def run_batch(engine: OfflineEngine, lines: list[str], model_name: str, loras: LoraRegistry | None = None,
              chat: ChatPrompt | None = None, defaults: dict | None = None) -> list[dict[str, Any]]:
    """``loras``: the adapters lines may name besides the base model (``base_names``); default none; ``chat``
    renders chat lines (default: the checkpoint's template); ``defaults``: the sampling fields lines leave out."""
    loras = loras or LoraRegistry(engine.checkpoint.config.lora_shape, 1, base_names(engine, model_name))
    chat = chat or ChatPrompt(engine.checkpoint.path, engine.encode)
    items = [parse_line(engine, i + 1, line, loras, chat, defaults) for i, line in enumerate(lines) if line.strip()]
    good = [it for it in items if it.error is None and it.beam is None]
    runs = [(it, j) for it in good for j in range(it.n)]  # one request per choice
    completions = engine.generate([it.prompt_token_ids for it, _ in runs], [it.params.for_choice(j) for it, j in runs],
                                  [it.lora for it, _ in runs], [it.cache_salt for it, _ in runs])
    by_line: dict[int, list[Completion]] = {}
    for (it, _), comp in zip(runs, completions, strict=True):
        by_line.setdefault(it.line_no, []).append(comp)
    for it in items:  # beam searches after the rest, one at a time (each runs its beams together)
        if it.error is None and it.beam is not None:
            try:
                by_line[it.line_no] = _beam_completions(engine, it)
            except SeawallError as exc:
                it.error = exc
    created = int(time.time())
    out = []
    for it in items:
        failed = it.error or next((c.error for c in by_line.get(it.line_no, ()) if c.error is not None), None)
        if failed is not None:  # a choice that failed fails the line, as a choice fails a response of the API
            out.append(_error_line(it, failed))
        else:
            out.append(_response_line(it, by_line[it.line_no], engine, it.lora.name if it.lora else model_name,
                                      created))
    return out


def _beam_completions(engine: OfflineEngine, item: BatchItem) -> list[Completion]:
    """A beam search's hypotheses, best first, as the line's choices."""
    eos = engine.checkpoint.eos_token_ids
    return [Completion(f"beam-{k}", item.prompt_token_ids, token_ids=h.token_ids, finish_reason=h.finish_reason,
                       text=hypothesis_text(engine.tokenizer.decode, h, item.params, eos))
            for k, h in enumerate(engine.beam_search(item.prompt_token_ids, item.beam, item.lora, item.cache_salt))]


def base_names(engine: OfflineEngine, model_name: str) -> tuple[str, ...]:
    """What ``body.model`` may say for the base model: the served name, the checkpoint's path or its name."""
    path = engine.checkpoint.path
    return model_name, str(path), path.name


def _response_line(item: BatchItem, comps: list[Completion], engine: OfflineEngine, model: str, created: int) -> dict:
    request_id = f"{'chatcmpl' if item.chat else 'cmpl'}-{uuid.uuid4().hex}"
    texts = TokenTexts(engine.tokenizer)
    choices = []
    for j, comp in enumerate(comps):
        logprobs = None
        if item.chat:
            logprobs = chat_logprobs(comp.logprobs, texts, item.as_ids) if item.params.logprobs is not None else None
            choices.append({"index": j, "message": {"role": "assistant", "content": comp.text},
                            "logprobs": logprobs, "finish_reason": comp.finish_reason, "token_ids": comp.token_ids})
            continue
        if item.params.logprobs is not None:
            logprobs = (echoed_completion_logprobs(comp.prompt_token_ids, comp.prompt_logprobs, comp.logprobs, texts,
                                                   item.as_ids)
                        if item.echo is not None else completion_logprobs(comp.logprobs, texts, as_ids=item.as_ids))
        choices.append({"index": j, "text": (item.echo or "") + comp.text, "logprobs": logprobs,
                        "finish_reason": comp.finish_reason, "token_ids": comp.token_ids})
        if item.prompt_scores:
            choices[-1]["prompt_logprobs"] = vllm_prompt_logprobs(comp.prompt_token_ids, comp.prompt_logprobs, texts)
    n_prompt, n_out = len(comps[0].prompt_token_ids), sum(len(c.token_ids) for c in comps)
    body = {
        "id": request_id,
        "object": "chat.completion" if item.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {  # the prompt once, though each choice ran it
            "prompt_tokens": n_prompt,
            "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": comps[0].num_cached_prompt_tokens},
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
