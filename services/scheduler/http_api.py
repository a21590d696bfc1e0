"""The OpenAI-compatible HTTP API, served by the scheduler process next to its gRPC service.

``/v1/completions``, ``/v1/chat/completions`` (the tokenizer's chat template), SSE streaming, ``/v1/models``,
``/health``, OpenAI's Responses API (``/v1/responses``, services/scheduler/responses_endpoint.py), Anthropic's
Messages API (``/v1/messages``, services/scheduler/anthropic_endpoint.py), embeddings (``/v1/embeddings``, and
vLLM's ``/score`` and ``/rerank`` from them: services/scheduler/embeddings_endpoint.py), and vLLM's
``/tokenize`` and ``/detokenize``. Prompts may be text or token ids, one or a list of them (completions); ``n`` choices per
prompt, choice ``i * n + j`` the j-th of prompt i, each its own request in the mesh (queued all or none);
``return_token_ids: true`` adds ``token_ids`` to each choice (vLLM's extension). Errors use OpenAI's shape,
``{"error": {"message", "type", "code"}}``, with
400 for bad input and 429 plus ``Retry-After`` for overload.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
from anyio.abc import TaskGroup
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from services.common import tracing
from services.common.errors import InvalidArgument, NotFound, SeawallError
from services.common.openai_logprobs import (
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    echoed_completion_logprobs,
    echoed_ids,
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
from services.common.version import VERSION
from services.scheduler.admission import check_cache_salt
from services.scheduler.anthropic_endpoint import MessagesEndpoint
from services.scheduler.api_key import ApiKey, ApiKeyMiddleware
from services.scheduler.beam_endpoint import BeamEndpoint
from services.scheduler.chat_prompt import ChatPrompt, chat_sampling
from services.scheduler.chat_tools import ToolCalling, tool_calling
from services.scheduler.classify_endpoint import ClassifyEndpoint
from services.scheduler.embeddings_endpoint import EmbeddingsEndpoint
from services.scheduler.frontend import Frontend, Submission
from services.scheduler.http_io import (
    REQUEST_ID_HEADER,
    continuous_usage,
    error_body,
    error_response,
    internal_error,
    json_body,
    request_id,
    request_priority,
    streaming,
)
from services.scheduler.lora_endpoints import LoraEndpoints
from services.scheduler.reasoning_parsers import AnyReasoning, AnyStream
from services.scheduler.responses_endpoint import ResponsesEndpoint
from services.scheduler.tool_parser_base import ToolParser
from services.scheduler.tracked import Delta, TrackedRequest


def create_app(frontend: Frontend, tasks: TaskGroup, registry: CollectorRegistry | None = None,
               tool_parser: ToolParser | None = None, reasoning: AnyReasoning | None = None,
               structured_in_reasoning: bool = False, lora_updating: bool = False,
               api_key: ApiKey | None = None, allowed_origins: Sequence[str] = (),
               tokens_as_ids: bool = False, chat: ChatPrompt | None = None,
               sampling_defaults: dict | None = None) -> Starlette:
    """The API's routes; ``tasks`` runs background responses; with ``registry``, also Prometheus text at
    ``/metrics``; ``tool_parser`` reads tool calls in the model's own syntax (``tool_choice: "auto"``),
    ``reasoning`` a chat reply's thinking, whose structured output applies after the thought unless
    ``structured_in_reasoning``; ``lora_updating`` serves the endpoints that load and unload LoRA adapters;
    with ``api_key``, requests without it are refused (api_key.py); browser pages from ``allowed_origins`` may
    call it (CORS); ``tokens_as_ids``: logprobs name tokens ``token_id:ID`` unless a request says otherwise;
    ``chat`` renders chat requests (default: the checkpoint's template); ``sampling_defaults``: the sampling
    fields requests leave out (``sampling_params.generation_defaults``)."""
    api = OpenAIApi(frontend, tool_parser, reasoning, structured_in_reasoning, tokens_as_ids, chat,
                    sampling_defaults)
    responses = ResponsesEndpoint(api, tasks)
    messages = MessagesEndpoint(api)
    classify = ClassifyEndpoint(api)
    embeddings = EmbeddingsEndpoint(api, classify.pair_scores if frontend.checkpoint.classifier else None)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/version", api.version, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{name:path}", api.model, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.stored, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"]),
        Route("/v1/responses/{response_id}/input_items", responses.input_items, methods=["GET"]),
        Route("/v1/messages", messages.create, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/v1/embeddings", embeddings.create, methods=["POST"]),
        *(Route(path, embeddings.score, methods=["POST"]) for path in ("/score", "/v1/score")),
        *(Route(path, embeddings.rerank, methods=["POST"]) for path in ("/rerank", "/v1/rerank", "/v2/rerank")),
        *(Route(path, classify.create, methods=["POST"]) for path in ("/classify", "/v1/classify")),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
    ]
    if lora_updating:
        loras = LoraEndpoints(frontend.loras)
        routes += [Route("/v1/load_lora_adapter", loras.load, methods=["POST"]),
                   Route("/v1/unload_lora_adapter", loras.unload, methods=["POST"])]
    if registry is not None:
        async def metrics(request: Request) -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        routes.append(Route("/metrics", metrics, methods=["GET"]))
    middleware = []
    if allowed_origins:  # outside the key check: a browser's preflight request carries no credentials
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                                     allow_headers=["*"], expose_headers=["x-queue-time", REQUEST_ID_HEADER]))
    if api_key is not None:
        middleware.append(Middleware(ApiKeyMiddleware, key=api_key))
    return Starlette(routes=routes, middleware=middleware, exception_handlers={Exception: internal_error})


class OpenAIApi:
    """The completions and chat endpoints, and the request plumbing the Responses endpoint runs on."""

    def __init__(self, frontend: Frontend, tool_parser: ToolParser | None = None,
                 reasoning: AnyReasoning | None = None, structured_in_reasoning: bool = False,
                 tokens_as_ids: bool = False, chat: ChatPrompt | None = None,
                 sampling_defaults: dict | None = None) -> None:
        self.frontend = frontend
        self.sampling_defaults = sampling_defaults or {}
        self.tokens_as_ids = tokens_as_ids  # vLLM's --return-tokens-as-token-ids: the requests' default
        self.tool_parser = tool_parser
        self.reasoning = reasoning
        self.structured_in_reasoning = structured_in_reasoning
        self.chat_template = chat or ChatPrompt(frontend.checkpoint.path, frontend.encode)
        self.texts = TokenTexts(frontend.tokenizer)
        self.beams = BeamEndpoint(self)

    async def health(self, request: Request) -> Response:
        workers = len(self.frontend.mesh.live_links())
        status = "draining" if self.frontend.draining else "ok" if workers else "no workers"
        return JSONResponse({"status": status, "workers": workers}, status_code=200 if status == "ok" else 503)

    async def version(self, request: Request) -> Response:
        """The running Seawall's version (vLLM serves the same shape at the same path)."""
        return JSONResponse({"version": VERSION})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self._model_cards()})

    async def model(self, request: Request) -> Response:
        """OpenAI's retrieve-model call (the SDK's ``models.retrieve``): one card of ``/v1/models``, or 404."""
        name, cards = request.path_params["name"], self._model_cards()
        card = next((c for c in cards if c["id"] == name), None)
        if card is None:
            served = ", ".join(repr(c["id"]) for c in cards)
            return error_response(NotFound(f"the model {name!r} does not exist here; this server serves {served}"))
        return JSONResponse(card)

    def _model_cards(self) -> list[dict[str, Any]]:
        """The base model (under each of its served names), then each LoRA adapter (its ``parent`` the base
        model, its ``root`` its directory), as vLLM lists them."""
        base = self.frontend.model_name
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "seawall",
                 "root": str(self.frontend.checkpoint.path), "parent": None,
                 "max_model_len": self.frontend.max_model_len} for name in self.frontend.model_names]
        data += [{"id": spec.ref.name, "object": "model", "created": 0, "owned_by": "seawall", "root": spec.ref.path,
                  "parent": base, "max_model_len": self.frontend.max_model_len} for spec in self.frontend.loras]
        return data

    async def completions(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            self._check_model(body)
            keep = prompt_truncation(body, self.frontend.max_model_len)
            # A truncated prompt is echoed as what ran: its tokens decoded.
            given = [(ids[-keep:], None) if keep is not None and len(ids) > keep else (ids, text)
                     for ids, text in self._prompts(body.get("prompt"), bool_field(body, "add_special_tokens", True))]
            prompts = [ids for ids, _ in given]
            params, n, echo = from_openai_completion(with_defaults(body, self.sampling_defaults))
            if bool_field(body, "use_beam_search"):
                return await self.beams.respond(request, body, prompts, params, n, chat=False)
            rid = request_id(request)
            tracked = self.submit(request, body, prompts, params, n, rid)
        except SeawallError as exc:
            return error_response(exc)
        # Echo the prompt as it was given: its text, or its token ids decoded.
        echoed = [text if text is not None else self.frontend.tokenizer.decode(ids, skip_special_tokens=False)
                  for ids, text in given for _ in range(n)] if echo else None
        return await self._respond(request, body, tracked, n, rid, chat=False, echoed=echoed)

    async def chat(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            prompt, params, n, tools = self.chat_request(body)
            if bool_field(body, "use_beam_search"):
                if tools is not None:
                    raise InvalidArgument("tools cannot be used with use_beam_search: omit one of them")
                return await self.beams.respond(request, body, [prompt], params, n, chat=True)
            rid = request_id(request)
            tracked = self.submit(request, body, [prompt], params, n, rid)
        except SeawallError as exc:
            return error_response(exc)
        return await self._respond(request, body, tracked, n, rid, chat=True, tools=tools)

    def chat_request(self, body: dict) -> tuple[list[int], SamplingParams, int, ToolCalling | None]:
        """A chat body as what runs: the rendered prompt, its sampling, choices per prompt, and the tool calls it
        may answer with."""
        self._check_model(body)
        tools = tool_calling(body, self.tool_parser)
        prompt = self.chat_template.render(body)
        keep = prompt_truncation(body, self.frontend.max_model_len)
        if keep is not None:
            prompt = prompt[-keep:]
        params, n = chat_sampling(with_defaults(body, self.sampling_defaults), self.frontend.room(len(prompt)))
        if tools is not None and tools.structured_output is not None:
            if params.structured_output is not None:
                raise InvalidArgument("a forced tool call constrains the output already: drop response_format "
                                      "(or the structured output) or tool_choice")
            params = replace(params, structured_output=tools.structured_output)
        if self.reasoning is not None and params.structured_output is not None and not self.structured_in_reasoning:
            # A reasoning model thinks first; the format (or the forced call) is its answer's, as in vLLM.
            params = replace(params, free_thought=self.reasoning.free_thought())
        if (self.reasoning is not None and self.reasoning.special_tokens) or (
                tools is not None and tools.parser is not None and tools.parser.special_tokens):
            # The markers are special tokens (harmony's; Mistral's [TOOL_CALLS]): the parsers must see them.
            params = replace(params, skip_special_tokens=False)
        return prompt, params, n, tools

    async def tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize``: a ``prompt`` (text) or chat ``messages`` (rendered by the chat template, as
        ``/v1/chat/completions`` would) as the token ids the model would see; ``add_special_tokens`` as there
        (default true for a prompt, false for messages, whose template writes them)."""
        try:
            body = await json_body(request)
            self._check_model(body)
            if "messages" in body:
                ids = self.chat_template.render(body)
            elif isinstance(body.get("prompt"), str):
                ids = self.frontend.encode(body["prompt"], bool_field(body, "add_special_tokens", default=True))
            else:
                raise InvalidArgument("send \"prompt\" (a string) or chat \"messages\"")
        except SeawallError as exc:
            return error_response(exc)
        return JSONResponse({"count": len(ids), "max_model_len": self.frontend.max_model_len, "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        """vLLM's ``/detokenize``: token ids as text (special tokens kept, as the model saw them)."""
        try:
            body = await json_body(request)
            tokens, vocab = body.get("tokens"), self.frontend.checkpoint.config.vocab_size
            if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
                raise InvalidArgument(f"tokens must be a list of token ids, got {tokens!r}")
            bad = next((t for t in tokens if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidArgument(f"token id {bad} is outside the vocabulary [0, {vocab})")
        except SeawallError as exc:
            return error_response(exc)
        return JSONResponse({"prompt": self.frontend.tokenizer.decode(tokens, skip_special_tokens=False)})

    def chat_prompt(self, body: dict) -> list[int]:
        """A chat body's messages (and tools) rendered by the chat template, as the token ids the model sees."""
        self._check_model(body)
        return self.chat_template.render(body)

    def _check_model(self, body: dict) -> LoraRef | None:
        """The LoRA adapter the body's ``model`` names, or None for the base model (its served name or its
        checkpoint's path, as vLLM accepts); another model gets 404, as OpenAI and vLLM answer it."""
        return self.frontend.loras.resolve(body.get("model"))

    def served_name(self, body: dict) -> str:
        """The ``model`` a response names: the adapter's name, or the base model's served name."""
        lora = self._check_model(body)
        return self.frontend.model_name if lora is None else lora.name

    def submit(self, request: Request, body: dict, prompts: list[list[int]], params: SamplingParams,
               n: int, rid: str = "") -> list[TrackedRequest]:
        """One request per choice, all queued or none; an error names the prompt it is about when there are
        several. ``rid``: their id (``rid-K`` for choice K of several; empty: new ones)."""
        session, priority, lora = _session(body), request_priority(body), self._check_model(body)
        salt = check_cache_salt(body.get("cache_salt"))
        # Checked here, before anything is queued; read when the response is written.
        streaming(body)
        bool_field(body, "return_token_ids")
        bool_field(body, "return_tokens_as_token_ids")
        parent = tracing.extract(request.headers)
        if len(prompts) == 1 and n == 1:
            return [self.frontend.submit(prompts[0], params, rid, trace_parent=parent, session_id=session,
                                         priority=priority, lora=lora, cache_salt=salt)]
        self.frontend.check_batch_size(len(prompts) * n)
        items = [Submission(p, params.for_choice(j), f"{rid}-{k * n + j}" if rid else "", session_id=session,
                            priority=priority, lora=lora, cache_salt=salt)
                 for k, p in enumerate(prompts) for j in range(n)]
        labels = [f"prompt[{k // n}]" if len(prompts) > 1 else "" for k in range(len(items))]
        return self.frontend.submit_many(items, parent, labels)

    def _prompts(self, prompt: Any, special: bool) -> list[tuple[list[int], str | None]]:
        """The prompts of a completion request, each as token ids and the text it was given as (None for ids):
        one text or token-id list, or a non-empty list of them; ``special``: texts get the special tokens their
        tokenizer adds (vLLM's ``add_special_tokens``, default true for completions)."""
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            return [self._prompt(p, f"prompt[{i}]", special) for i, p in enumerate(prompt)]
        return [self._prompt(prompt, "prompt", special)]

    def _prompt(self, prompt: Any, name: str, special: bool) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return self.frontend.encode(prompt, special), prompt
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt, None
        raise InvalidArgument(f"{name} must be a string or a list of token ids (or prompt a list of those)")

    async def _respond(self, request: Request, body: dict, tracked: list[TrackedRequest], n: int, rid: str,
                       chat: bool, echoed: list[str] | None = None, tools: ToolCalling | None = None) -> Response:
        """``echoed``: per choice, the prompt text its output follows (completions' ``echo``); ``tools``: the
        output is a forced tool call, returned as ``tool_calls``."""
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "created": int(time.time()),
                "model": self.served_name(body)}
        stream, include_usage = streaming(body)
        as_ids = (self.tokens_as_ids if body.get("return_tokens_as_token_ids") is None
                  else bool_field(body, "return_tokens_as_token_ids"))
        extras = _Extras(bool_field(body, "return_token_ids"), body.get("prompt_logprobs") is not None, self.texts,
                         as_ids, continuous_usage(body))
        if stream:
            if not await self.started(request, tracked):
                return Response(status_code=499)  # nobody reads it: the client went away while queued
            return StreamingResponse(self._sse(head, tracked, n, chat, extras, include_usage, echoed, tools),
                                     media_type="text/event-stream", headers=self.reply_headers(tracked, rid))
        merged = await self.collect(request, tracked)
        failed = next((out.error for out in merged if out.error is not None), None)
        if failed is not None:  # a choice that failed fails the response, as in vLLM
            return error_response(failed)
        choices = []
        for i, out in enumerate(merged):
            choice: dict[str, Any] = {"index": i, "finish_reason": out.finish_reason,
                                      "logprobs": self._logprobs(tracked[i], out, chat, extras.as_ids,
                                                                 echo=echoed is not None)}
            if chat:
                thought, text = self.split_reasoning(tracked[i], out.text)
                choice["message"], choice["finish_reason"] = (
                    tools.message(text, out.finish_reason) if tools is not None
                    else ({"role": "assistant", "content": text}, out.finish_reason))
                if thought is not None:
                    choice["message"]["reasoning_content"] = thought
            else:
                choice["text"] = (echoed[i] if echoed else "") + out.text
            extras.fill(choice, tracked[i], out)
            choices.append(choice)
        obj = "chat.completion" if chat else "text_completion"
        return JSONResponse({**head, "object": obj, "choices": choices, "usage": self._usage(tracked, n, chat)},
                            headers=self.reply_headers(tracked, rid))

    def reply_headers(self, tracked: Sequence[TrackedRequest], rid: str = "") -> dict[str, str]:
        """TGI's ``x-queue-time`` header: how long the request queued before its first step, in ms (its
        longest-waiting choice's of those begun: a stream's headers go out with its first token), which the
        client cannot tell from its own clock; and vLLM's ``x-request-id`` with ``rid``."""
        headers = {"x-queue-time": f"{max(self.frontend.queue_delay_ms(t) for t in tracked):.3f}"}
        if rid:
            headers[REQUEST_ID_HEADER] = rid
        return headers

    async def started(self, request: Request, tracked: list[TrackedRequest]) -> bool:
        """Waits until a choice produced its first token (or ended), so that a stream's headers can carry
        ``x-queue-time`` as a whole reply's do: its first event would not go out sooner. False when the client
        disconnected first, and the requests are aborted then (no reader of theirs has begun to free them)."""
        async def first(t: TrackedRequest) -> None:
            await t.arrived.wait()
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while not await request.is_disconnected():
                await anyio.sleep(0.25)
            tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                for t in tracked:
                    tg.start_soon(first, t)
        finally:  # also when the server stops meanwhile
            if not any(t.arrived.is_set() for t in tracked):
                for t in tracked:
                    self.frontend.abort_unless_done(t)
        return any(t.arrived.is_set() for t in tracked)

    async def collect(self, request: Request, tracked: list[TrackedRequest]) -> list[Delta]:
        """Every choice's whole output; aborts them all if the client disconnects first."""
        merged = [Delta() for _ in tracked]
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while not await request.is_disconnected():
                    await anyio.sleep(0.25)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            if len(tracked) == 1:
                merged[0] = await self.frontend.collect(tracked[0])
            else:
                async for ready in self.frontend.stream_many(tracked, [True] * len(tracked)):
                    for i, delta in ready:
                        merged[i] = delta
            tg.cancel_scope.cancel()
        return merged

    async def _sse(self, head: dict, tracked: list[TrackedRequest], n: int, chat: bool, extras: _Extras,
                   include_usage: bool, echoed: list[str] | None = None,
                   tools: ToolCalling | None = None) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        first = [True] * len(tracked)
        offsets = [0] * len(tracked)  # characters of each choice's token texts so far (completions' text_offset)
        produced = [0] * len(tracked)  # each choice's tokens so far (vLLM's continuous_usage_stats)
        calls = [tools.stream() for _ in tracked] if tools is not None else None
        thoughts = [self.reasoning_stream(t) for t in tracked] if chat else None
        async for ready in self.stream(tracked):
            for i, merged in ready:  # one event per choice, as OpenAI streams them
                thought = ""
                if thoughts is not None and thoughts[i] is not None:
                    thought, answer = thoughts[i].feed(merged.text, final=merged.finish_reason is not None)
                    merged = replace(merged, text=answer)
                echo = echoed is not None and first[i]  # the prompt goes out with the choice's first chunk
                logprobs = self._logprobs(tracked[i], merged, chat, extras.as_ids, offsets[i], echo=echo)
                if logprobs is not None and not chat:  # the texts' characters, whatever names the tokens
                    shown = [t.token_id for t in merged.logprobs]
                    if echo:
                        shown[:0] = echoed_ids(tracked[i].request.prompt_token_ids, merged.prompt_logprobs)
                    offsets[i] += sum(len(self.texts(t)) for t in shown)
                choice: dict[str, Any] = {"index": i, "finish_reason": merged.finish_reason, "logprobs": logprobs}
                if calls is not None:
                    choice["delta"], choice["finish_reason"] = calls[i].delta(merged)
                elif chat:
                    choice["delta"] = ({"role": "assistant", "content": merged.text} if first[i]
                                       else {"content": merged.text})
                else:
                    choice["text"] = (echoed[i] if echo else "") + merged.text
                if thought:
                    choice["delta"]["reasoning_content"] = thought
                extras.fill(choice, tracked[i], merged)
                first[i] = False
                event = {**head, "object": obj, "choices": [choice]}
                if extras.usage_so_far:
                    produced[i] += len(merged.token_ids)
                    prompt = len(tracked[i].request.prompt_token_ids)
                    event["usage"] = {"prompt_tokens": prompt, "completion_tokens": produced[i],
                                      "total_tokens": prompt + produced[i]}
                yield _event(event)
                if merged.error is not None:
                    # The status line went out with the first event: the error comes as an event (vLLM's and
                    # OpenAI's shape, which OpenAI's clients raise), and the other choices are cut short.
                    for other in tracked:
                        self.frontend.mesh.abort(other.request_id)
                    yield _event(error_body(merged.error))
                    yield "data: [DONE]\n\n"
                    return
        if include_usage:
            yield _event({**head, "object": obj, "choices": [], "usage": self._usage(tracked, n, chat)})
        yield "data: [DONE]\n\n"

    def _usage(self, tracked: list[TrackedRequest], n: int, chat: bool) -> dict:
        thought = sum(self.reasoning_tokens(t) for t in tracked) if chat and self.reasoning is not None else None
        return _usage(tracked, n, thought)

    def split_reasoning(self, tracked: TrackedRequest, text: str) -> tuple[str | None, str]:
        """A whole chat reply's thinking (None without a reasoning parser, or without a thought) and answer."""
        if self.reasoning is None:
            return None, text
        thought, answer = self.reasoning.split(text, constrained=_constrained_from_start(tracked))
        return thought, answer or ""

    def reasoning_tokens(self, tracked: TrackedRequest) -> int:
        """How many of a chat reply's output tokens are its thought (OpenAI's usage ``reasoning_tokens``)."""
        if self.reasoning is None:
            return 0
        params = tracked.request.params
        return self.reasoning.thought_tokens(
            tracked.request.output_token_ids,
            lambda ids: self.frontend.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens),
            constrained=_constrained_from_start(tracked))

    def reasoning_stream(self, tracked: TrackedRequest) -> AnyStream | None:
        """A splitter of a chat reply's thinking as it streams, when the mesh reads reasoning."""
        if self.reasoning is None:
            return None
        return self.reasoning.stream(constrained=_constrained_from_start(tracked))

    def _logprobs(self, tracked: TrackedRequest, delta: Delta, chat: bool, as_ids: bool, offset: int = 0,
                  echo: bool = False) -> dict | None:
        """The delta's tokens' logprobs in the endpoint's shape, when the request asked for them; ``echo``: the
        prompt's tokens and scores first (completions); ``as_ids``: tokens named ``token_id:ID``."""
        if tracked.request.params.logprobs is None:
            return None
        if chat:
            return chat_logprobs(delta.logprobs, self.texts, as_ids)
        if not echo:
            return completion_logprobs(delta.logprobs, self.texts, offset, as_ids)
        return echoed_completion_logprobs(tracked.request.prompt_token_ids, delta.prompt_logprobs, delta.logprobs,
                                          self.texts, as_ids)

    async def stream(self, tracked: list[TrackedRequest]) -> AsyncIterator[list[tuple[int, Delta]]]:
        if len(tracked) == 1:
            async for delta in self.frontend.stream(tracked[0]):
                yield [(0, delta)]
        else:
            async for ready in self.frontend.stream_many(tracked, [False] * len(tracked)):
                yield ready


@dataclass(frozen=True)
class _Extras:
    """Seawall's and vLLM's additions to a choice: ``token_ids`` (``return_token_ids``) and the prompt's scores
    (``prompt_logprobs: k``, in the delta with the first token); and vLLM's ``return_tokens_as_token_ids``
    (``as_ids``: logprobs name tokens ``token_id:ID``) and ``continuous_usage_stats`` (``usage_so_far``: each
    streamed chunk carries its choice's usage so far)."""

    token_ids: bool
    prompt_logprobs: bool
    texts: TokenTexts
    as_ids: bool = False
    usage_so_far: bool = False

    def fill(self, choice: dict[str, Any], tracked: TrackedRequest, delta: Delta) -> None:
        if self.token_ids:
            choice["token_ids"] = delta.token_ids
        if self.prompt_logprobs and delta.prompt_logprobs:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(tracked.request.prompt_token_ids, delta.prompt_logprobs,
                                                             self.texts)


def _session(body: dict) -> str:
    """Seawall's extension: ``session_id`` names a multi-turn conversation whose KV is kept for its next turn."""
    session = body.get("session_id") or ""
    if not isinstance(session, str):
        raise InvalidArgument("session_id must be a string")
    return session


def _constrained_from_start(tracked: TrackedRequest) -> bool:
    """Whether a grammar wrote the reply from its first token (so it thinks only if the grammar opens a thought)."""
    params = tracked.request.params
    return params.structured_output is not None and not params.free_thought


def _usage(tracked: Sequence[TrackedRequest], n: int, reasoning_tokens: int | None = None) -> dict:
    """Prompt tokens once per prompt (its n choices share it), completion tokens of every choice; with
    ``reasoning_tokens`` (a chat reply read by a reasoning parser), how many of those were thought."""
    firsts = [t.request for t in tracked[::n]]
    n_prompt = sum(len(r.prompt_token_ids) for r in firsts)
    n_out = sum(len(t.request.output_token_ids) for t in tracked)
    usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
             "prompt_tokens_details": {"cached_tokens": sum(r.num_prefix_hit_tokens for r in firsts)}}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
