"""Beam search on the completions and chat endpoints: vLLM's ``use_beam_search`` with ``n`` beams, each
returned as a choice, best first (services/common/beam_search.py has the rules, transformers')."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.common import tracing
from services.common.beam_search import BeamParams, Hypothesis, beam_from_openai, hypothesis_text
from services.common.errors import SeawallError
from services.common.sampling_params import SamplingParams, bool_field
from services.scheduler.admission import check_cache_salt
from services.scheduler.beam_driver import beam_search
from services.scheduler.frontend import Submission, labelled
from services.scheduler.http_io import error_response, request_priority, streaming

if TYPE_CHECKING:
    from services.scheduler.http_api import OpenAIApi


class BeamEndpoint:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api
        self.frontend = api.frontend

    async def respond(self, request: Request, body: dict, prompts: list[list[int]], params: SamplingParams, n: int,
                      chat: bool) -> Response:
        """Every prompt's beam search, run together; choice ``i * n + j`` is prompt i's j-th best hypothesis."""
        try:
            items, beams = self._prepare(body, prompts, params, n)
            stream, include_usage = streaming(body)
            token_ids = bool_field(body, "return_token_ids")
        except SeawallError as exc:
            return error_response(exc)
        results = await self._search_all(request, items, beams, tracing.extract(request.headers))
        if isinstance(results, SeawallError):
            return error_response(results)
        if results is None:  # the client went away: the searches were stopped, nobody reads this
            return Response(status_code=499)
        choices = [self._choice(k, hyp, params, chat, token_ids)
                   for k, hyp in enumerate(h for result in results for h in result)]
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": self.api.served_name(body)}
        n_prompt = sum(len(p) for p in prompts)
        n_out = sum(len(h.token_ids) for result in results for h in result)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        if stream:
            return StreamingResponse(_events(head, choices, chat, usage if include_usage else None),
                                     media_type="text/event-stream")
        return JSONResponse({**head, "object": "chat.completion" if chat else "text_completion", "choices": choices,
                             "usage": usage})

    async def _search_all(self, request: Request, items: list[Submission], beams: list[BeamParams],
                          parent) -> list[list[Hypothesis]] | SeawallError | None:
        """Every search's hypotheses; the first error, which stops the others; or None when the client went
        away first (stopping them too: a cancelled step's requests are aborted)."""
        results: list[list[Hypothesis] | None] = [None] * len(items)
        errors: list[SeawallError] = []
        async with anyio.create_task_group() as outer:
            async def run(i: int) -> None:
                try:
                    results[i] = await beam_search(self.frontend, items[i], beams[i], parent)
                except SeawallError as exc:
                    errors.append(exc)
                    outer.cancel_scope.cancel()

            async def watch() -> None:
                while not await request.is_disconnected():
                    await anyio.sleep(0.25)
                outer.cancel_scope.cancel()

            outer.start_soon(watch)
            async with anyio.create_task_group() as searches:
                for i in range(len(items)):
                    searches.start_soon(run, i)
            outer.cancel_scope.cancel()  # all done: stop watching
        if errors:
            return errors[0]
        return None if any(r is None for r in results) else results

    def _prepare(self, body: dict, prompts: list[list[int]], params: SamplingParams,
                 n: int) -> tuple[list[Submission], list[BeamParams]]:
        frontend = self.frontend
        lora, priority = self.api._check_model(body), request_priority(body)
        salt = check_cache_salt(body.get("cache_salt"))
        frontend.check_batch_size(n * len(prompts))  # each step queues up to n requests per prompt
        items, beams = [], []
        for i, prompt in enumerate(prompts):
            label = f"prompt[{i}]" if len(prompts) > 1 else ""
            labelled(label, frontend.validate, prompt, params)
            beam = labelled(label, beam_from_openai, body, params, n, frontend.checkpoint.eos_token_ids,
                            frontend.max_model_len - len(prompt))
            assert beam is not None, "only bodies asking for use_beam_search are routed here"
            items.append(Submission(prompt, params, priority=priority, lora=lora, cache_salt=salt))
            beams.append(beam)
        return items, beams

    def _choice(self, index: int, hyp: Hypothesis, params: SamplingParams, chat: bool, token_ids: bool) -> dict:
        text = hypothesis_text(self.frontend.tokenizer.decode, hyp, params, self.frontend.checkpoint.eos_token_ids)
        choice: dict[str, Any] = {"index": index, "finish_reason": hyp.finish_reason, "logprobs": None}
        if chat:
            reasoning = self.api.reasoning
            thought, answer = reasoning.split(text, constrained=False) if reasoning is not None else (None, text)
            choice["message"] = {"role": "assistant", "content": answer or ""}
            if thought is not None:
                choice["message"]["reasoning_content"] = thought
        else:
            choice["text"] = text
        if token_ids:
            choice["token_ids"] = hyp.token_ids
        return choice


async def _events(head: dict, choices: list[dict], chat: bool, usage: dict | None) -> AsyncIterator[str]:
    """The finished beams as a stream: one event per choice holding all of it (a beam's text is known only
    when the search ends), as vLLM streams a beam search."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    for choice in choices:
        if chat:
            choice = {**choice, "delta": choice["message"]}
            del choice["message"]
        yield _event({**head, "object": obj, "choices": [choice]})
    if usage is not None:
        yield _event({**head, "object": obj, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
