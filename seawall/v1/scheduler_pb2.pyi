from seawall.v1 import common_pb2 as _common_pb2
from seawall.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EarlyStopping(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EARLY_STOPPING_UNSPECIFIED: _ClassVar[EarlyStopping]
    EARLY_STOPPING_TRUE: _ClassVar[EarlyStopping]
    EARLY_STOPPING_NEVER: _ClassVar[EarlyStopping]
EARLY_STOPPING_UNSPECIFIED: EarlyStopping
EARLY_STOPPING_TRUE: EarlyStopping
EARLY_STOPPING_NEVER: EarlyStopping

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StreamOptions(_message.Message):
    __slots__ = ("return_token_ids", "return_text")
    RETURN_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RETURN_TEXT_FIELD_NUMBER: _ClassVar[int]
    return_token_ids: bool
    return_text: bool
    def __init__(self, return_token_ids: _Optional[bool] = ..., return_text: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "text", "token_ids", "sampling", "session_id", "stream_options", "priority", "final_only", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    FINAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    text: str
    token_ids: TokenIds
    sampling: _common_pb2.SamplingParams
    session_id: str
    stream_options: StreamOptions
    priority: int
    final_only: bool
    cache_salt: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., session_id: _Optional[str] = ..., stream_options: _Optional[_Union[StreamOptions, _Mapping]] = ..., priority: _Optional[int] = ..., final_only: _Optional[bool] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "logprobs", "finish_reason", "finish_detail", "usage", "queue_delay_ms", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    FINISH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    finish_reason: _common_pb2.FinishReason
    finish_detail: str
    usage: _common_pb2.Usage
    queue_delay_ms: float
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., finish_detail: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., queue_delay_ms: _Optional[float] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class BeamSearchRequest(_message.Message):
    __slots__ = ("request", "beam_width", "length_penalty", "early_stopping")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    BEAM_WIDTH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    beam_width: int
    length_penalty: float
    early_stopping: EarlyStopping
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., beam_width: _Optional[int] = ..., length_penalty: _Optional[float] = ..., early_stopping: _Optional[_Union[EarlyStopping, str]] = ...) -> None: ...

class BeamHypothesis(_message.Message):
    __slots__ = ("token_ids", "text", "finish_reason", "cumulative_logprob", "score")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: _common_pb2.FinishReason
    cumulative_logprob: float
    score: float
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., cumulative_logprob: _Optional[float] = ..., score: _Optional[float] = ...) -> None: ...

class BeamSearchResponse(_message.Message):
    __slots__ = ("hypotheses", "usage")
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    hypotheses: _containers.RepeatedCompositeFieldContainer[BeamHypothesis]
    usage: _common_pb2.Usage
    def __init__(self, hypotheses: _Optional[_Iterable[_Union[BeamHypothesis, _Mapping]]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class GenerateBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[GenerateRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[GenerateRequest, _Mapping]]] = ...) -> None: ...

class BatchOutput(_message.Message):
    __slots__ = ("index", "response")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    index: int
    response: GenerateResponse
    def __init__(self, index: _Optional[int] = ..., response: _Optional[_Union[GenerateResponse, _Mapping]] = ...) -> None: ...

class GenerateBatchResponse(_message.Message):
    __slots__ = ("outputs",)
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[BatchOutput]
    def __init__(self, outputs: _Optional[_Iterable[_Union[BatchOutput, _Mapping]]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "inputs", "dimensions", "priority")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[EmbedInput]
    dimensions: int
    priority: int
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[EmbedInput, _Mapping]]] = ..., dimensions: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class EmbedInput(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "usage")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[EmbedVector]
    usage: _common_pb2.Usage
    def __init__(self, embeddings: _Optional[_Iterable[_Union[EmbedVector, _Mapping]]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class EmbedVector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("classifications", "usage")
    CLASSIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    classifications: _containers.RepeatedCompositeFieldContainer[Classification]
    usage: _common_pb2.Usage
    def __init__(self, classifications: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("label", "probs", "logits")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    label: str
    probs: _containers.RepeatedScalarFieldContainer[float]
    logits: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, label: _Optional[str] = ..., probs: _Optional[_Iterable[float]] = ..., logits: _Optional[_Iterable[float]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("worker_id", "address", "role", "num_device_blocks", "num_device_blocks_used", "num_device_blocks_cached", "num_host_blocks", "num_host_blocks_used", "num_running", "num_prefix_queried_blocks", "num_prefix_hit_blocks", "prompt_token_budget", "step_time", "num_draft_tokens", "num_accepted_draft_tokens", "kv_layout", "draining")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_DEVICE_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_DEVICE_BLOCKS_CACHED_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_QUERIED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    role: _worker_pb2.WorkerRole
    num_device_blocks: int
    num_device_blocks_used: int
    num_device_blocks_cached: int
    num_host_blocks: int
    num_host_blocks_used: int
    num_running: int
    num_prefix_queried_blocks: int
    num_prefix_hit_blocks: int
    prompt_token_budget: int
    step_time: _worker_pb2.StepTimeProfile
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    kv_layout: _common_pb2.KVLayout
    draining: bool
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[_Union[_worker_pb2.WorkerRole, str]] = ..., num_device_blocks: _Optional[int] = ..., num_device_blocks_used: _Optional[int] = ..., num_device_blocks_cached: _Optional[int] = ..., num_host_blocks: _Optional[int] = ..., num_host_blocks_used: _Optional[int] = ..., num_running: _Optional[int] = ..., num_prefix_queried_blocks: _Optional[int] = ..., num_prefix_hit_blocks: _Optional[int] = ..., prompt_token_budget: _Optional[int] = ..., step_time: _Optional[_Union[_worker_pb2.StepTimeProfile, _Mapping]] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_draft_tokens: _Optional[int] = ..., kv_layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., draining: _Optional[bool] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("policy", "queue_lengths", "num_running", "num_waiting", "num_swapped", "num_preemptions", "num_finished", "num_steps", "workers", "num_migrations", "num_queued_moves", "num_precopied_blocks")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_SWAPPED_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    NUM_MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUEUED_MOVES_FIELD_NUMBER: _ClassVar[int]
    NUM_PRECOPIED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    queue_lengths: _containers.RepeatedScalarFieldContainer[int]
    num_running: int
    num_waiting: int
    num_swapped: int
    num_preemptions: int
    num_finished: int
    num_steps: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStats]
    num_migrations: int
    num_queued_moves: int
    num_precopied_blocks: int
    def __init__(self, policy: _Optional[str] = ..., queue_lengths: _Optional[_Iterable[int]] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_swapped: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., num_finished: _Optional[int] = ..., num_steps: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStats, _Mapping]]] = ..., num_migrations: _Optional[int] = ..., num_queued_moves: _Optional[int] = ..., num_precopied_blocks: _Optional[int] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("address", "info")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    address: str
    info: _worker_pb2.WorkerInfo
    def __init__(self, address: _Optional[str] = ..., info: _Optional[_Union[_worker_pb2.WorkerInfo, _Mapping]] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class DrainWorkerResponse(_message.Message):
    __slots__ = ("num_moved", "num_finished")
    NUM_MOVED_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_FIELD_NUMBER: _ClassVar[int]
    num_moved: int
    num_finished: int
    def __init__(self, num_moved: _Optional[int] = ..., num_finished: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "scheduler_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    scheduler_id: str
    def __init__(self, worker_id: _Optional[str] = ..., scheduler_id: _Optional[str] = ...) -> None: ...
