"""A live request on the scheduler: the core's ``Request`` plus its output stream and detokenizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
from tokenizers import Tokenizer

from services.common.errors import SeawallError
from services.common.sampling_params import FinishReason, text_left_out
from services.common.step import SampledToken, merge_prompt_scores
from services.engine.detokenizer import IncrementalDetokenizer
from services.scheduler.core.request import Request


@dataclass
class Delta:
    """What one request produced since its reader last looked; ``finish_reason`` is set on the last one."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[SampledToken] = field(default_factory=list)
    # The prompt's scores (SamplingParams.prompt_logprobs), positions 1.., in the delta with the first token.
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    finish_reason: str | None = None
    detail: str = ""
    # With finish_reason "error": what went wrong, as the error the client is given (its status says whose
    # fault: InvalidArgument for a request that cannot go on, SeawallError for the mesh's own failures).
    error: SeawallError | None = None


class TrackedRequest:
    """Tokens are appended to one pending ``Delta`` that the reader takes whole (``take``), with an event to
    wake it: a step's token costs a few appends, not a message through a queue, and a reader that falls behind
    (or one that only wants the end) gets everything since it last looked in one piece."""

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
        self.moves = 0  # times moved off a worker that failed while holding it (SchedulerServiceConfig.max_moves)
        self._pending = Delta()
        self.arrived = anyio.Event()  # set when _pending holds something; replaced by take()
        self.done = anyio.Event()  # set with the last token: a non-streaming reader wakes once, not per token
        self.on_arrive: Callable[[TrackedRequest], None] | None = None  # a BatchWatch reading it with others
        self.prompt_logprobs: list[SampledToken] = []  # scores of prompt positions 1, 2, ... so far
        # An embedding request's (SamplingParams.pooling) last hidden state, as its worker returned it.
        self.hidden_state: list[float] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def emit(self, token: SampledToken, finish_reason: str | None) -> str | None:
        """Streams one sampled token; returns the finish reason, which a stop string in the text may set."""
        if self.finished:
            return finish_reason
        self.num_emitted += 1
        request = self.request
        if request.params.pooling:  # its token stands in for the hidden state: there is no text
            self.detok.push_stop_token()
            text = ""
        elif text_left_out(request.params, token.token_id, finish_reason, request.eos_token_ids):
            self.detok.push_stop_token()
            text = ""
        else:
            text = self.detok.push(token.token_id)
        if finish_reason is None and self.detok.finished_by_stop_string is not None:
            finish_reason = FinishReason.STOP
        if finish_reason is not None:
            text += self.detok.flush()
        pending = self._pending
        if self.num_emitted == 1 and self.prompt_logprobs:
            pending.prompt_logprobs = list(self.prompt_logprobs)
        pending.token_ids.append(token.token_id)
        pending.text += text
        if token.logprob is not None:
            pending.logprobs.append(token)
        self._arrive(finish_reason, self.detok.finished_by_stop_string or "")
        return finish_reason

    def add_prompt_logprobs(self, start: int, tokens: list[SampledToken]) -> None:
        """Scores of prompt positions ``start``, ``start + 1``... (``merge_prompt_scores``)."""
        merge_prompt_scores(self.prompt_logprobs, start, tokens)

    def end(self, reason: str, detail: str = "") -> None:
        """Ends the stream without a token (abort, error)."""
        if not self.finished:
            self._pending.text += self.detok.flush()
            self._arrive(reason, detail)

    def fail(self, error: SeawallError) -> None:
        """Ends the stream with ``error`` (finish reason "error", its message as the detail)."""
        if not self.finished:
            self._pending.error = error
            self.end(FinishReason.ERROR, str(error))

    def take(self) -> Delta:
        """Everything that arrived since the last take (empty if nothing did); the last take carries the
        finish reason."""
        delta, self._pending = self._pending, Delta()
        if not self.finished:
            self.arrived = anyio.Event()
        return delta

    def _arrive(self, finish_reason: str | None, detail: str) -> None:
        if finish_reason is not None:
            self.finish_reason = self._pending.finish_reason = finish_reason
            self._pending.detail = detail
            self.done.set()
        self.arrived.set()
        if self.on_arrive is not None:
            self.on_arrive(self)


class BatchWatch:
    """One reader of several requests (a batch call): a single event (``changed``) wakes it for whichever of
    them has something to take, and ``take()`` says which, so a wake-up costs one event however many requests
    there are.

    ``final_only[i]``: request ``i`` is noted only when it finishes (its reader wants the output whole).
    """

    def __init__(self, requests: Sequence[TrackedRequest], final_only: Sequence[bool]) -> None:
        self._index = {id(t): i for i, t in enumerate(requests)}
        self._final_only = list(final_only)
        self._ready: dict[int, None] = {}  # indices to read, in the order they became ready
        self.changed = anyio.Event()
        for t in requests:
            t.on_arrive = self._note
            if t.arrived.is_set():  # produced (or ended) before the watch began
                self._note(t)

    def _note(self, tracked: TrackedRequest) -> None:
        i = self._index[id(tracked)]
        if tracked.finished or not self._final_only[i]:
            self._ready[i] = None
            self.changed.set()

    def take(self) -> list[int]:
        """The indices of requests with something to take since the last call, in the order they got it."""
        ready, self._ready = list(self._ready), {}
        self.changed = anyio.Event()
        return ready
