"""The Python SDK: ``Client`` (blocking) and ``AsyncClient`` (asyncio) over the Scheduler gRPC service.

    from seawall import Client
    with Client("127.0.0.1:50051") as client:
        out = client.generate("The quick brown fox", max_tokens=16, temperature=0)
        print(out.text, out.token_ids, out.finish_reason)
        for chunk in client.stream([1, 2, 3], max_tokens=8):
            print(chunk.text, end="", flush=True)

Sampling options are ``SamplingParams`` fields (max_tokens, temperature, top_k, top_p, min_p, seed, stop,
stop_token_ids, ignore_eos, min_tokens, logprobs, penalties, logit_bias as {token id: bias},
allowed_token_ids, structured_output as (kind, spec), e.g. ("json", schema text) or ("regex", pattern)); they
are validated before anything is sent. Of those, temperature, top_k, top_p, min_p and repetition_penalty, when
left out, take the model's generation config (as an OpenAI API request's do), else their neutral values.
With ``logprobs=k`` each chunk and completion carries ``logprobs``: a ``SampledToken`` per token (its logprob,
rank and the top k candidates); with ``prompt_logprobs=k``, ``prompt_logprobs`` scores the prompt the same way.
``beam_search(prompt, beam_width, length_penalty=..., early_stopping=...)`` returns the best hypotheses of a
beam search (``BeamHypothesis``: token ids, text, finish reason, summed logprob, score), best first.
``classify(inputs)`` returns a sequence classifier's classes for each input (``Classification``: label, probs,
logits). ``embed(inputs, dimensions=...)`` returns each input's embedding (``Embed``: an embedding checkpoint's pooled
vector, or a generative model's last hidden state, normalized).
Server errors arrive as ``services.common.errors`` exceptions: ``InvalidArgument``, ``ResourceExhausted``...
A mesh started with an API key needs it: ``Client(address, api_key=...)``, or ``$SEAWALL_API_KEY``.
"""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import errors
from services.common.convert import (
    UNSET_TAKES_MODEL_DEFAULT,
    finish_reason_from_proto,
    params_to_proto,
    sampled_token_from_proto,
)
from services.common.credentials import api_key_or_env, bearer_metadata
from services.common.grpc_server import CHANNEL_OPTIONS
from services.common.rpc import rpc, rpc_stream
from services.common.sampling_params import SamplingParams, logit_bias_pairs
from services.common.step import SampledToken

DEFAULT_ADDRESS = "127.0.0.1:50051"


@dataclass
class Chunk:
    """One streamed piece of output."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    queue_delay_ms: float = 0.0
    # With the finish reason: the stop string or token that matched, or, for "error", what went wrong.
    finish_detail: str = ""
    # With ``logprobs=k``: each token's logprob, rank and top-k candidates, aligned with ``token_ids``.
    logprobs: list[SampledToken] = field(default_factory=list)
    # With ``prompt_logprobs=k``, in the chunk with the first token: prompt positions 1, 2, ... scored.
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    # Prompt tokens whose KV was reused instead of computed (prefix cache, kvcache, a decode worker's cache).
    cached_prompt_tokens: int = 0


@dataclass
class Completion:
    """A finished request."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    finish_detail: str = ""  # as in Chunk
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    queue_delay_ms: float = 0.0
    logprobs: list[SampledToken] = field(default_factory=list)
    prompt_logprobs: list[SampledToken] = field(default_factory=list)


@dataclass
class BeamHypothesis:
    """One of a beam search's results (``beam_search``), best first."""

    token_ids: list[int]  # after the prompt; an end token it stopped at included
    text: str  # an end token's text left out
    finish_reason: str | None  # "stop" (an end token) or "length"
    cumulative_logprob: float
    score: float  # cumulative_logprob / len(token_ids) ** length_penalty: what the beams are ranked by


_EARLY_STOPPING = {False: scheduler_pb2.EARLY_STOPPING_UNSPECIFIED, True: scheduler_pb2.EARLY_STOPPING_TRUE,
                   "never": scheduler_pb2.EARLY_STOPPING_NEVER}


def build_beam_search(prompt: str | Sequence[int], beam_width: int, length_penalty: float,
                      early_stopping: bool | str, sampling: dict[str, Any]) -> scheduler_pb2.BeamSearchRequest:
    """``sampling``: as ``build_request`` takes it (max_tokens, ignore_eos, stop_token_ids... and model,
    priority, cache_salt)."""
    if isinstance(beam_width, bool) or not isinstance(beam_width, int) or not 1 <= beam_width < 2**32:
        raise errors.InvalidArgument(f"beam_width must be an integer >= 1, got {beam_width!r}")
    if not any(early_stopping is v for v in (True, False)) and early_stopping != "never":
        raise errors.InvalidArgument(f"early_stopping must be True, False or \"never\", got {early_stopping!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise errors.InvalidArgument(f"length_penalty must be a number, got {length_penalty!r}")
    return scheduler_pb2.BeamSearchRequest(request=build_request(prompt, None, sampling), beam_width=beam_width,
                                           length_penalty=length_penalty,
                                           early_stopping=_EARLY_STOPPING[early_stopping])


@dataclass
class Classification:
    """One input's classes (``classify``)."""

    label: str  # the best class's
    probs: list[float]  # each class's score (softmax, or sigmoid for multi-label heads and one class)
    logits: list[float]  # each class's logit (a reward model's reward)


def _classifications(reply: scheduler_pb2.ClassifyResponse) -> list[Classification]:
    return [Classification(c.label, list(c.probs), list(c.logits)) for c in reply.classifications]


def _hypotheses(reply: scheduler_pb2.BeamSearchResponse) -> list[BeamHypothesis]:
    return [BeamHypothesis(list(h.token_ids), h.text, finish_reason_from_proto(h.finish_reason),
                           h.cumulative_logprob, h.score) for h in reply.hypotheses]


def build_request(prompt: str | Sequence[int], request_id: str | None, sampling: dict[str, Any],
                  final_only: bool = False) -> scheduler_pb2.GenerateRequest:
    """``sampling`` holds SamplingParams fields, plus ``session_id`` (turns of one conversation: their KV is
    kept in kvcache for the next turn), ``priority`` (lower runs sooner, 0 = normal), ``model`` (a LoRA
    adapter's name; default the base model) and ``cache_salt`` (only requests with the same salt share cached
    KV). ``final_only``: one response at the end instead of one per step."""
    session_id = sampling.pop("session_id", "") or ""
    priority = sampling.pop("priority", 0) or 0
    model = sampling.pop("model", "") or ""
    cache_salt = sampling.pop("cache_salt", "") or ""
    # Checked here: protobuf's own refusals ("bad argument type for built-in operation") name no field.
    for name, value in (("request_id", request_id or ""), ("session_id", session_id), ("model", model),
                        ("cache_salt", cache_salt)):
        if not isinstance(value, str):
            raise errors.InvalidArgument(f"{name} must be a string, got {value!r}")
    _check_priority(priority)
    # Python shapes as the OpenAI API takes them: one stop string, or lists where the dataclass keeps tuples.
    for key in ("stop", "bad_words"):
        if isinstance(sampling.get(key), str):
            sampling[key] = (sampling[key],)
    for key in ("stop", "stop_token_ids", "allowed_token_ids", "bad_words"):
        if isinstance(sampling.get(key), list):
            sampling[key] = tuple(sampling[key])
    if isinstance(sampling.get("logit_bias"), dict):
        sampling["logit_bias"] = logit_bias_pairs(sampling["logit_bias"])
    params = params_to_proto(SamplingParams(**sampling))
    for name in UNSET_TAKES_MODEL_DEFAULT:  # what the caller left out: the model's generation config says
        if name not in sampling:
            params.ClearField(name)
    msg = scheduler_pb2.GenerateRequest(request_id=request_id or f"sdk-{uuid.uuid4().hex[:16]}",
                                        sampling=params, session_id=session_id, final_only=final_only,
                                        priority=priority, model=model, cache_salt=cache_salt)
    if isinstance(prompt, str):
        msg.text = prompt
    else:
        msg.token_ids.ids.extend(_token_ids(prompt, "prompt"))
    return msg


def _check_priority(priority: Any) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) or not -2**31 <= priority < 2**31:
        raise errors.InvalidArgument(f"priority must be an integer (lower runs sooner, 0 = normal), got {priority!r}")


def _token_ids(ids: Iterable[int], what: str) -> list[int]:
    """A prompt given as token ids (a list, tuple, numpy array...), each an integer the wire's uint32 holds:
    anything else is refused here, in Seawall's words, instead of by protobuf's encoder (``Value out of range``)
    or, for bytes, sent as if each byte were a token."""
    if isinstance(ids, bytes | bytearray | dict) or not isinstance(ids, Iterable):
        raise errors.InvalidArgument(f"{what} must be a text or a list of token ids, got {ids!r}")
    out = []
    for t in ids:
        try:
            if isinstance(t, bool):
                raise TypeError
            t = operator.index(t)
        except TypeError:
            raise errors.InvalidArgument(f"{what} must be a text or a list of token ids (integers), got an item {t!r}") from None
        if not 0 <= t < 2**32:
            raise errors.InvalidArgument(f"{what} token id {t} is out of range (token ids are integers >= 0)")
        out.append(t)
    return out


def _chunk(reply: scheduler_pb2.GenerateResponse) -> Chunk:
    logprobs = [sampled_token_from_proto(lp.sampled.token_id, lp) for lp in reply.logprobs]
    prompt = [sampled_token_from_proto(lp.sampled.token_id, lp) for lp in reply.prompt_logprobs]
    return Chunk(reply.request_id, list(reply.token_ids), reply.text, finish_reason_from_proto(reply.finish_reason),
                 reply.queue_delay_ms, reply.finish_detail, logprobs, prompt, reply.usage.cached_prompt_tokens)


def _fold(chunks: list[Chunk], last: scheduler_pb2.GenerateResponse | None) -> Completion:
    out = Completion(chunks[0].request_id if chunks else "")
    for c in chunks:
        out.token_ids.extend(c.token_ids)
        out.text += c.text
        out.logprobs.extend(c.logprobs)
        out.prompt_logprobs.extend(c.prompt_logprobs)
        out.finish_reason = c.finish_reason or out.finish_reason
        out.finish_detail = c.finish_detail or out.finish_detail
    if last is not None:
        out.prompt_tokens = last.usage.prompt_tokens
        out.cached_prompt_tokens = last.usage.cached_prompt_tokens
        out.queue_delay_ms = last.queue_delay_ms
    return out


def build_batch(prompts: Sequence[str | Sequence[int]], sampling: dict[str, Any]) -> scheduler_pb2.GenerateBatchRequest:
    if isinstance(prompts, Iterable) and not isinstance(prompts, Sequence):
        prompts = list(prompts)  # a generator too: its length sizes the completions
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (each text or token ids)")
    return scheduler_pb2.GenerateBatchRequest(requests=[build_request(p, None, dict(sampling), final_only=True)
                                                        for p in prompts])


def build_embed(inputs: str | Sequence[int] | Sequence[str | Sequence[int]], model: str | None, dimensions: int | None,
                priority: int) -> scheduler_pb2.EmbedRequest:
    """OpenAI's input shapes: one text, one list of token ids, or a list of either."""
    if isinstance(inputs, Iterable) and not isinstance(inputs, Sequence):
        inputs = list(inputs)  # a generator too, which the test below would otherwise consume in part
    if isinstance(inputs, str) or (inputs and all(isinstance(t, int) for t in inputs)):
        inputs = [inputs]
    if not inputs:
        raise ValueError("inputs must be a text, a list of token ids, or a non-empty list of those")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 0):
        raise errors.InvalidArgument(f"dimensions must be an integer >= 1 (None or 0: all of them), got {dimensions!r}")
    _check_priority(priority)
    msg = scheduler_pb2.EmbedRequest(model=model or "", dimensions=dimensions or 0, priority=priority)
    for i, item in enumerate(inputs):
        one = msg.inputs.add()
        if isinstance(item, str):
            one.text = item
        else:
            one.token_ids.ids.extend(_token_ids(item, f"inputs[{i}]"))
    return msg


class _BatchFold:
    """A batch's completions, in prompt order, from its interleaved outputs."""

    def __init__(self, n: int) -> None:
        self.chunks: list[list[Chunk]] = [[] for _ in range(n)]
        self.last: list[scheduler_pb2.GenerateResponse | None] = [None] * n

    def add(self, reply: scheduler_pb2.GenerateBatchResponse) -> None:
        for out in reply.outputs:
            self.chunks[out.index].append(_chunk(out.response))
            self.last[out.index] = out.response

    def completions(self) -> list[Completion]:
        return [_fold(c, last) for c, last in zip(self.chunks, self.last, strict=True)]


def _error(exc: grpc.RpcError) -> errors.SeawallError:
    return errors.error_for_code(exc.code().name, exc.details() or str(exc.code()))


class _Keyed:
    """A stub whose every call carries the API key."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerStub, key: str) -> None:
        self._stub, self._metadata = stub, bearer_metadata(key)

    def __getattr__(self, name: str):
        return functools.partial(getattr(self._stub, name), metadata=self._metadata)


def _stub(channel, api_key: str | None) -> scheduler_pb2_grpc.SchedulerStub:
    key = api_key_or_env(api_key)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    return _Keyed(stub, key) if key else stub


class AsyncClient:
    """``api_key``: the mesh's key, if it asks for one (default: ``$SEAWALL_API_KEY``)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, api_key: str | None = None) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = _stub(self._channel, api_key)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def stream(self, prompt: str | Sequence[int], request_id: str | None = None,
                     **sampling: Any) -> AsyncIterator[Chunk]:
        """Streams a request's output; leaving the loop early aborts the request on the server."""
        call = self._stub.Generate(build_request(prompt, request_id, sampling))
        try:
            async for reply in rpc_stream(call):
                yield _chunk(reply)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        finally:
            call.cancel()

    async def generate(self, prompt: str | Sequence[int], request_id: str | None = None,
                       **sampling: Any) -> Completion:
        chunks, last = [], None
        try:
            async for reply in rpc_stream(self._stub.Generate(build_request(prompt, request_id, sampling,
                                                                            final_only=True))):
                chunks.append(_chunk(reply))
                last = reply
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return _fold(chunks, last)

    async def generate_batch(self, prompts: Sequence[str | Sequence[int]], **sampling: Any) -> list[Completion]:
        """Completions of several prompts with the same sampling, in prompt order, through one call
        (``GenerateBatch``): for batch jobs, where one call per prompt costs both sides a call's work each."""
        batch = build_batch(prompts, sampling)
        fold = _BatchFold(len(batch.requests))
        try:
            async for reply in rpc_stream(self._stub.GenerateBatch(batch)):
                fold.add(reply)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return fold.completions()

    async def embed(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]], model: str | None = None,
                    dimensions: int | None = None, priority: int = 0) -> list[list[float]]:
        """Each input's embedding (``Embed``), in input order: one text or token-id list gives a list of one.
        ``dimensions`` keeps the first values of each (renormalized where the model normalizes)."""
        try:
            reply = await rpc(self._stub.Embed(build_embed(inputs, model, dimensions, priority)))
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return [list(v.values) for v in reply.embeddings]

    async def classify(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]], model: str | None = None,
                       priority: int = 0) -> list[Classification]:
        """Each input's classes (``Classify``: a sequence-classification checkpoint's), in input order."""
        try:
            reply = await rpc(self._stub.Classify(build_embed(inputs, model, None, priority)))
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return _classifications(reply)

    async def beam_search(self, prompt: str | Sequence[int], beam_width: int, *, length_penalty: float = 1.0,
                          early_stopping: bool | str = False, **sampling: Any) -> list[BeamHypothesis]:
        """The prompt's ``beam_width`` best hypotheses by beam search (``BeamSearch``; transformers' rules), best
        first. ``sampling``: max_tokens, ignore_eos, stop_token_ids (more end tokens), and model, priority,
        cache_salt; other sampling options are refused."""
        try:
            reply = await rpc(self._stub.BeamSearch(build_beam_search(prompt, beam_width, length_penalty,
                                                                      early_stopping, sampling)))
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return _hypotheses(reply)

    async def abort(self, request_id: str) -> bool:
        """Ends a live request (its stream gets finish reason ``abort``); False when none has that id."""
        try:
            return (await rpc(self._stub.Abort(scheduler_pb2.AbortRequest(request_id=request_id)))).found
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    async def stats(self) -> scheduler_pb2.GetStatsResponse:
        try:
            return await rpc(self._stub.GetStats(scheduler_pb2.GetStatsRequest()))
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None


class Client:
    """The blocking twin of ``AsyncClient``."""

    def __init__(self, address: str = DEFAULT_ADDRESS, api_key: str | None = None) -> None:
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._open_stub: scheduler_pb2_grpc.SchedulerStub | None = _stub(self._channel, api_key)

    @property
    def _stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        # grpc's own error for a closed channel is a bare ValueError ("Cannot invoke RPC: Channel closed!").
        if self._open_stub is None:
            raise errors.SeawallError("this Client is closed (close() or the end of its with block); make another")
        return self._open_stub

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._open_stub = None
        self._channel.close()

    def stream(self, prompt: str | Sequence[int], request_id: str | None = None, **sampling: Any) -> Iterator[Chunk]:
        call = self._stub.Generate(build_request(prompt, request_id, sampling))
        try:
            for reply in call:
                yield _chunk(reply)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        finally:
            call.cancel()

    def generate(self, prompt: str | Sequence[int], request_id: str | None = None, **sampling: Any) -> Completion:
        chunks, last = [], None
        try:
            for reply in self._stub.Generate(build_request(prompt, request_id, sampling, final_only=True)):
                chunks.append(_chunk(reply))
                last = reply
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return _fold(chunks, last)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], **sampling: Any) -> list[Completion]:
        batch = build_batch(prompts, sampling)
        fold = _BatchFold(len(batch.requests))
        try:
            for reply in self._stub.GenerateBatch(batch):
                fold.add(reply)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return fold.completions()

    def embed(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]], model: str | None = None,
              dimensions: int | None = None, priority: int = 0) -> list[list[float]]:
        try:
            reply = self._stub.Embed(build_embed(inputs, model, dimensions, priority))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return [list(v.values) for v in reply.embeddings]

    def classify(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]], model: str | None = None,
                 priority: int = 0) -> list[Classification]:
        try:
            reply = self._stub.Classify(build_embed(inputs, model, None, priority))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return _classifications(reply)

    def beam_search(self, prompt: str | Sequence[int], beam_width: int, *, length_penalty: float = 1.0,
                    early_stopping: bool | str = False, **sampling: Any) -> list[BeamHypothesis]:
        try:
            reply = self._stub.BeamSearch(build_beam_search(prompt, beam_width, length_penalty, early_stopping,
                                                            sampling))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return _hypotheses(reply)

    def abort(self, request_id: str) -> bool:
        try:
            return self._stub.Abort(scheduler_pb2.AbortRequest(request_id=request_id)).found
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def stats(self) -> scheduler_pb2.GetStatsResponse:
        try:
            return self._stub.GetStats(scheduler_pb2.GetStatsRequest())
        except grpc.RpcError as exc:
            raise _error(exc) from None
