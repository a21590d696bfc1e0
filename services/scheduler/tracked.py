"""A live request on the scheduler: the core's ``Request`` plus its output stream and detokenizer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import anyio
from tokenizers import Tokenizer

from services.common.sampling_params import FinishReason
from services.common.step import SampledToken
from services.engine.detokenizer import IncrementalDetokenizer
from services.scheduler.core.request import Request


@dataclass
class Delta:
    """What one request produced since the last delta; ``finish_reason`` is set on the last one."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[SampledToken] = field(default_factory=list)
    finish_reason: str | None = None
    detail: str = ""


class TrackedRequest:
    def __init__(self, request: Request, tokenizer: Tokenizer, arrival: float, session_id: str = "") -> None:
        self.request = request
        self.session_id = session_id
        self.arrival = arrival
        self.first_scheduled: float | None = None
        self.last_token_at: float | None = None
        self.trace = None  # a RequestTrace when tracing is on
        self.detok = IncrementalDetokenizer(tokenizer, request.params, prompt_token_ids=request.prompt_token_ids)
        self.finish_reason: str | None = None
        self.num_emitted = 0  # tokens streamed so far
        self._send, self.receive = anyio.create_memory_object_stream[Delta](math.inf)
        self.done = anyio.Event()  # set with the last delta: lets a non-streaming reader wake once, not per token

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def emit(self, token: SampledToken, finish_reason: str | None) -> str | None:
        """Streams one sampled token; returns the finish reason, which a stop string in the text may set."""
        self.num_emitted += 1
        text = self.detok.push(token.token_id)
        if finish_reason is None and self.detok.finished_by_stop_string is not None:
            finish_reason = FinishReason.STOP
        if finish_reason is not None:
            text += self.detok.flush()
        logprobs = [token] if token.logprob is not None else []
        self._put(Delta([token.token_id], text, logprobs, finish_reason, self.detok.finished_by_stop_string or ""))
        return finish_reason

    def end(self, reason: str, detail: str = "") -> None:
        """Ends the stream without a token (abort, error)."""
        if not self.finished:
            self._put(Delta(text=self.detok.flush(), finish_reason=reason, detail=detail))

    def _put(self, delta: Delta) -> None:
        if self.finished:
            return
        self.finish_reason = delta.finish_reason
        self._send.send_nowait(delta)
        if delta.finish_reason is not None:
            self._send.close()
            self.done.set()
