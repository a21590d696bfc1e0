"""A chat request as what runs, read as the chat completions API reads it: the messages (and tools) rendered by
the checkpoint's chat template with vLLM's turn options (``add_generation_prompt``, ``continue_final_message``)
and ``chat_template_kwargs`` (OpenAI's ``reasoning_effort`` among them), and the sampling in OpenAI's chat
spelling (``max_completion_tokens``, ``logprobs`` + ``top_logprobs``). Shared by the HTTP API (which adds tool
calls and reasoning) and ``seawall run-batch``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import jinja2

from services.common.errors import InvalidArgument
from services.common.sampling_params import MAX_LOGPROBS, SamplingParams, bool_field, num_choices
from services.scheduler.chat_template import (
    compile_template,
    load_template,
    sorted_keys,
    sorts_tools,
    special_tokens,
    template_messages,
)
from services.scheduler.chat_tools import chat_messages, open_final_message

# Chat fields handled here or by the API layer rather than by SamplingParams.from_openai.
CHAT_ONLY = {"session_id", "messages", "max_completion_tokens", "top_logprobs", "logprobs", "tools",
             "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "n", "reasoning_effort",
             "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template", "documents"}
# OpenAI's reasoning_effort values; the chat template gets the value (gpt-oss's reads it, others ignore it).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


class ChatPrompt:
    def __init__(self, path: Path, encode: Callable[[str, bool], list[int]], template: str | None = None,
                 trust_request_templates: bool = False) -> None:
        """``path``: the checkpoint (its template, special tokens and tokenizer class); ``encode(text,
        add_special_tokens)``: its tokenizer; ``template``: the server's own (vLLM's ``--chat-template``), in
        place of the checkpoint's; ``trust_request_templates``: a request may bring its own (vLLM's
        ``--trust-request-chat-template``: the server then renders whatever a client sends)."""
        self._template = compile_template(template) if template is not None else load_template(path)
        self._trust_requests = trust_request_templates
        # A client sending its template with every request has it compiled once.
        self._compile = functools.lru_cache(maxsize=16)(compile_template)
        self._special_tokens = special_tokens(path)
        self._sort_tools = sorts_tools(path)
        self._encode = encode

    def render(self, body: dict) -> list[int]:
        """The body's messages and tools as the token ids the model sees. The template writes the special tokens
        (a Llama's ``{{ bos_token }}``), so the tokenizer adds none unless vLLM's ``add_special_tokens`` asks:
        transformers' ``apply_chat_template`` does the same (a tokenizer adding a BOS of its own made it two)."""
        messages = chat_messages(body.get("messages"))
        template = self._request_template(body) or self._template
        if template is None:
            raise InvalidArgument("this model has no chat template: use /v1/completions, or start the server with "
                                  "--chat-template")
        add_prompt, continue_final = turn_options(body)
        # Tools go to the template as the client sent them (keys sorted where the tokenizer sorts them):
        # templates that describe tools to the model do so. chat_template_kwargs come last and win, as in vLLM.
        tools = sorted_keys(body["tools"]) if self._sort_tools and body.get("tools") else body.get("tools")
        variables = {**self._special_tokens, "add_generation_prompt": add_prompt,
                     **({"tools": tools} if tools else {}), **_documents(body), **template_kwargs(body),
                     "messages": template_messages(messages)}
        try:
            text = template.render(**variables)
        except jinja2.TemplateError as exc:  # e.g. a template that raises on a role order it does not support
            raise InvalidArgument(f"the model's chat template cannot render these messages: {exc}") from None
        if continue_final:
            text = open_final_message(text, messages[-1])
        return self._encode(text, bool_field(body, "add_special_tokens"))

    def _request_template(self, body: dict) -> jinja2.Template | None:
        """The request's own ``chat_template`` (vLLM's field), compiled; None when it brings none."""
        source = body.get("chat_template")
        if source is None:
            return None
        if not self._trust_requests:
            raise InvalidArgument("chat_template in a request needs a server started with "
                                  "--trust-request-chat-template; omit it to use the model's")
        if not isinstance(source, str) or not source.strip():
            raise InvalidArgument(f"chat_template must be a Jinja template (a non-empty string), got {source!r}")
        try:
            return self._compile(source)
        except jinja2.TemplateSyntaxError as exc:
            raise InvalidArgument(f"chat_template does not compile: {exc}") from None


def chat_sampling(body: dict, room: int | None = None) -> tuple[SamplingParams, int]:
    """A chat body's sampling (before tool calls and reasoning shape it) and ``n``; ``room``: the ``max_tokens``
    of a body that sets none (OpenAI's chat has no limit but the context; vLLM's default is what is left of it),
    else the completions API's 16."""
    sampling = {k: v for k, v in body.items() if k not in CHAT_ONLY}
    if body.get("max_completion_tokens") is not None:
        sampling["max_tokens"] = body["max_completion_tokens"]
    elif sampling.get("max_tokens") is None and room is not None:
        sampling["max_tokens"] = room
    top = body.get("top_logprobs")
    logprobs = bool_field(body, "logprobs")
    if top is not None and not logprobs:
        raise InvalidArgument("top_logprobs needs \"logprobs\": true")
    if logprobs:
        top = top or 0
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise InvalidArgument(f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {top!r}")
        sampling["logprobs"] = top
    return SamplingParams.from_openai(sampling), num_choices(body)


def _documents(body: dict) -> dict:
    """vLLM's ``documents`` (transformers' ``apply_chat_template(documents=...)``): objects of strings a RAG
    model's template lays out, such as ``{"title": ..., "text": ...}``."""
    docs = body.get("documents")
    if docs is None:
        return {}
    if not isinstance(docs, list) or not all(
            isinstance(d, dict) and all(isinstance(v, str) for v in d.values()) for d in docs):
        raise InvalidArgument(f"documents must be a list of objects of strings (such as {{\"title\": ..., "
                              f"\"text\": ...}}), got {docs!r:.200}")
    return {"documents": docs}


def template_kwargs(body: dict) -> dict:
    """What the chat template is rendered with besides the messages: ``chat_template_kwargs`` (vLLM's), and
    OpenAI's ``reasoning_effort`` as the template variable of that name, as vLLM passes it."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidArgument(f"chat_template_kwargs must be an object, got {kwargs!r}")
    if "messages" in kwargs:
        raise InvalidArgument("chat_template_kwargs cannot hold messages: send them as the request's messages")
    effort = body.get("reasoning_effort")
    if effort is None:
        return kwargs
    if effort not in REASONING_EFFORTS:
        raise InvalidArgument(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    return {"reasoning_effort": effort, **kwargs}


def turn_options(body: dict) -> tuple[bool, bool]:
    """vLLM's ``add_generation_prompt`` (open the assistant's turn; default true) and ``continue_final_message``
    (continue the final message instead, e.g. an assistant reply begun by the client; default false)."""
    cont = bool_field(body, "continue_final_message")
    add = bool_field(body, "add_generation_prompt") if body.get("add_generation_prompt") is not None else not cont
    if add and cont:
        raise InvalidArgument("add_generation_prompt and continue_final_message cannot both be true: continuing "
                              "the final message opens no new turn")
    return add, cont
