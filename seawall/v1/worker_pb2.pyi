from seawall.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_PREFILL: _ClassVar[WorkerRole]
    WORKER_ROLE_DECODE: _ClassVar[WorkerRole]
    WORKER_ROLE_HYBRID: _ClassVar[WorkerRole]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_PREFILL: WorkerRole
WORKER_ROLE_DECODE: WorkerRole
WORKER_ROLE_HYBRID: WorkerRole

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("role", "model", "num_device_blocks", "num_host_blocks", "kv_layout", "device", "nixl", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "eos_token_ids", "version", "step_time", "sliding_window", "recurrent_state", "state_checkpoints", "host_state_checkpoints")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NIXL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    RECURRENT_STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    HOST_STATE_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    role: WorkerRole
    model: str
    num_device_blocks: int
    num_host_blocks: int
    kv_layout: _common_pb2.KVLayout
    device: str
    nixl: _common_pb2.NixlAgentMetadata
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    version: str
    step_time: StepTimeProfile
    sliding_window: int
    recurrent_state: bool
    state_checkpoints: int
    host_state_checkpoints: int
    def __init__(self, role: _Optional[_Union[WorkerRole, str]] = ..., model: _Optional[str] = ..., num_device_blocks: _Optional[int] = ..., num_host_blocks: _Optional[int] = ..., kv_layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., device: _Optional[str] = ..., nixl: _Optional[_Union[_common_pb2.NixlAgentMetadata, _Mapping]] = ..., max_model_len: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., version: _Optional[str] = ..., step_time: _Optional[_Union[StepTimeProfile, _Mapping]] = ..., sliding_window: _Optional[int] = ..., recurrent_state: _Optional[bool] = ..., state_checkpoints: _Optional[int] = ..., host_state_checkpoints: _Optional[int] = ...) -> None: ...

class StepTimeProfile(_message.Message):
    __slots__ = ("base_ms", "per_token_ms", "per_seq_ms")
    BASE_MS_FIELD_NUMBER: _ClassVar[int]
    PER_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    PER_SEQ_MS_FIELD_NUMBER: _ClassVar[int]
    base_ms: float
    per_token_ms: float
    per_seq_ms: float
    def __init__(self, base_ms: _Optional[float] = ..., per_token_ms: _Optional[float] = ..., per_seq_ms: _Optional[float] = ...) -> None: ...

class BlockMove(_message.Message):
    __slots__ = ("src_block_id", "dst_block_id")
    SRC_BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    src_block_id: int
    dst_block_id: int
    def __init__(self, src_block_id: _Optional[int] = ..., dst_block_id: _Optional[int] = ...) -> None: ...

class NewSequence(_message.Message):
    __slots__ = ("seq_id", "token_ids", "num_prompt_tokens", "num_computed_tokens", "block_ids", "sampling", "trace_context", "lora", "state_checkpoint")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    trace_context: _containers.ScalarMap[str, str]
    lora: _common_pb2.LoraAdapter
    state_checkpoint: int
    def __init__(self, seq_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_prompt_tokens: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., lora: _Optional[_Union[_common_pb2.LoraAdapter, _Mapping]] = ..., state_checkpoint: _Optional[int] = ...) -> None: ...

class StateMove(_message.Message):
    __slots__ = ("device_slot", "host_slot")
    DEVICE_SLOT_FIELD_NUMBER: _ClassVar[int]
    HOST_SLOT_FIELD_NUMBER: _ClassVar[int]
    device_slot: int
    host_slot: int
    def __init__(self, device_slot: _Optional[int] = ..., host_slot: _Optional[int] = ...) -> None: ...

class StateSave(_message.Message):
    __slots__ = ("seq_id", "tokens_into_step", "slot")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INTO_STEP_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    tokens_into_step: int
    slot: int
    def __init__(self, seq_id: _Optional[str] = ..., tokens_into_step: _Optional[int] = ..., slot: _Optional[int] = ...) -> None: ...

class ContinuingSequence(_message.Message):
    __slots__ = ("seq_id", "new_block_ids", "num_computed_tokens", "appended_token_ids", "block_ids", "replace_block_table")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPENDED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_BLOCK_TABLE_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    new_block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    appended_token_ids: _containers.RepeatedScalarFieldContainer[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    replace_block_table: bool
    def __init__(self, seq_id: _Optional[str] = ..., new_block_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ..., appended_token_ids: _Optional[_Iterable[int]] = ..., block_ids: _Optional[_Iterable[int]] = ..., replace_block_table: _Optional[bool] = ...) -> None: ...

class StepPlan(_message.Message):
    __slots__ = ("step_id", "scheduler_id", "new_sequences", "continuing", "scheduled_seq_ids", "num_scheduled_tokens", "finished_seq_ids", "swap_out", "swap_in", "copy", "trace_context", "speculative", "state_saves", "swapped_out_seq_ids", "state_moves")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    CONTINUING_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    SWAP_OUT_FIELD_NUMBER: _ClassVar[int]
    SWAP_IN_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    STATE_SAVES_FIELD_NUMBER: _ClassVar[int]
    SWAPPED_OUT_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    STATE_MOVES_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    scheduler_id: str
    new_sequences: _containers.RepeatedCompositeFieldContainer[NewSequence]
    continuing: _containers.RepeatedCompositeFieldContainer[ContinuingSequence]
    scheduled_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    num_scheduled_tokens: _containers.RepeatedScalarFieldContainer[int]
    finished_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    swap_out: _containers.RepeatedCompositeFieldContainer[BlockMove]
    swap_in: _containers.RepeatedCompositeFieldContainer[BlockMove]
    copy: _containers.RepeatedCompositeFieldContainer[BlockMove]
    trace_context: _containers.ScalarMap[str, str]
    speculative: bool
    state_saves: _containers.RepeatedCompositeFieldContainer[StateSave]
    swapped_out_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    state_moves: _containers.RepeatedCompositeFieldContainer[StateMove]
    def __init__(self, step_id: _Optional[int] = ..., scheduler_id: _Optional[str] = ..., new_sequences: _Optional[_Iterable[_Union[NewSequence, _Mapping]]] = ..., continuing: _Optional[_Iterable[_Union[ContinuingSequence, _Mapping]]] = ..., scheduled_seq_ids: _Optional[_Iterable[str]] = ..., num_scheduled_tokens: _Optional[_Iterable[int]] = ..., finished_seq_ids: _Optional[_Iterable[str]] = ..., swap_out: _Optional[_Iterable[_Union[BlockMove, _Mapping]]] = ..., swap_in: _Optional[_Iterable[_Union[BlockMove, _Mapping]]] = ..., copy: _Optional[_Iterable[_Union[BlockMove, _Mapping]]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., speculative: _Optional[bool] = ..., state_saves: _Optional[_Iterable[_Union[StateSave, _Mapping]]] = ..., swapped_out_seq_ids: _Optional[_Iterable[str]] = ..., state_moves: _Optional[_Iterable[_Union[StateMove, _Mapping]]] = ...) -> None: ...

class SequenceError(_message.Message):
    __slots__ = ("seq_id", "code", "message")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    code: int
    message: str
    def __init__(self, seq_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("seq_id", "values")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, seq_id: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "sampled_seq_ids", "num_sampled_tokens", "sampled_token_ids", "logprobs", "prompt_logprob_seq_ids", "prompt_logprob_starts", "num_prompt_logprobs", "prompt_logprobs", "errors", "embeddings", "forward_time_ms", "step_time_ms", "num_tokens", "num_seqs", "num_sampled", "num_blocks_moved", "num_draft_tokens", "num_accepted_tokens")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROB_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROB_STARTS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_MOVED_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    sampled_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    num_sampled_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampled_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    prompt_logprob_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    prompt_logprob_starts: _containers.RepeatedScalarFieldContainer[int]
    num_prompt_logprobs: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    errors: _containers.RepeatedCompositeFieldContainer[SequenceError]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    forward_time_ms: float
    step_time_ms: float
    num_tokens: int
    num_seqs: int
    num_sampled: int
    num_blocks_moved: int
    num_draft_tokens: int
    num_accepted_tokens: int
    def __init__(self, step_id: _Optional[int] = ..., sampled_seq_ids: _Optional[_Iterable[str]] = ..., num_sampled_tokens: _Optional[_Iterable[int]] = ..., sampled_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., prompt_logprob_seq_ids: _Optional[_Iterable[str]] = ..., prompt_logprob_starts: _Optional[_Iterable[int]] = ..., num_prompt_logprobs: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[SequenceError, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., forward_time_ms: _Optional[float] = ..., step_time_ms: _Optional[float] = ..., num_tokens: _Optional[int] = ..., num_seqs: _Optional[int] = ..., num_sampled: _Optional[int] = ..., num_blocks_moved: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_tokens: _Optional[int] = ...) -> None: ...

class PushKVRequest(_message.Message):
    __slots__ = ("transfer_id", "dst", "src_block_ids", "dst_block_ids", "notification_key", "timeout_ms", "transport")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    dst: _common_pb2.KVEndpoint
    src_block_ids: _containers.RepeatedScalarFieldContainer[int]
    dst_block_ids: _containers.RepeatedScalarFieldContainer[int]
    notification_key: str
    timeout_ms: int
    transport: _common_pb2.KVTransport
    def __init__(self, transfer_id: _Optional[str] = ..., dst: _Optional[_Union[_common_pb2.KVEndpoint, _Mapping]] = ..., src_block_ids: _Optional[_Iterable[int]] = ..., dst_block_ids: _Optional[_Iterable[int]] = ..., notification_key: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., transport: _Optional[_Union[_common_pb2.KVTransport, str]] = ...) -> None: ...

class PushKVResponse(_message.Message):
    __slots__ = ("status", "bytes", "duration_ms", "error")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.TransferStatus
    bytes: int
    duration_ms: float
    error: str
    def __init__(self, status: _Optional[_Union[_common_pb2.TransferStatus, str]] = ..., bytes: _Optional[int] = ..., duration_ms: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class PullKVRequest(_message.Message):
    __slots__ = ("transfer_id", "src", "src_block_ids", "dst_block_ids", "notification_key", "timeout_ms", "transport", "state_seq_id", "state_checkpoint", "state_checkpoint_tokens")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    STATE_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKPOINT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    src: _common_pb2.KVEndpoint
    src_block_ids: _containers.RepeatedScalarFieldContainer[int]
    dst_block_ids: _containers.RepeatedScalarFieldContainer[int]
    notification_key: str
    timeout_ms: int
    transport: _common_pb2.KVTransport
    state_seq_id: str
    state_checkpoint: int
    state_checkpoint_tokens: int
    def __init__(self, transfer_id: _Optional[str] = ..., src: _Optional[_Union[_common_pb2.KVEndpoint, _Mapping]] = ..., src_block_ids: _Optional[_Iterable[int]] = ..., dst_block_ids: _Optional[_Iterable[int]] = ..., notification_key: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., transport: _Optional[_Union[_common_pb2.KVTransport, str]] = ..., state_seq_id: _Optional[str] = ..., state_checkpoint: _Optional[int] = ..., state_checkpoint_tokens: _Optional[int] = ...) -> None: ...

class PullKVResponse(_message.Message):
    __slots__ = ("status", "bytes", "duration_ms", "error")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.TransferStatus
    bytes: int
    duration_ms: float
    error: str
    def __init__(self, status: _Optional[_Union[_common_pb2.TransferStatus, str]] = ..., bytes: _Optional[int] = ..., duration_ms: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class WorkerAbortRequest(_message.Message):
    __slots__ = ("seq_ids", "transfer_ids")
    SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_IDS_FIELD_NUMBER: _ClassVar[int]
    seq_ids: _containers.RepeatedScalarFieldContainer[str]
    transfer_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seq_ids: _Optional[_Iterable[str]] = ..., transfer_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkerAbortResponse(_message.Message):
    __slots__ = ("unknown_seq_ids", "unknown_transfer_ids")
    UNKNOWN_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TRANSFER_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    unknown_transfer_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown_seq_ids: _Optional[_Iterable[str]] = ..., unknown_transfer_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("seq_ids",)
    SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    seq_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seq_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class FreeResponse(_message.Message):
    __slots__ = ("unknown_seq_ids",)
    UNKNOWN_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_seq_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown_seq_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadKVRequest(_message.Message):
    __slots__ = ("block_ids", "max_chunk_bytes")
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    max_chunk_bytes: int
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("block_ids", "data", "transfer_id")
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    transfer_id: str
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., transfer_id: _Optional[str] = ...) -> None: ...

class WriteKVResponse(_message.Message):
    __slots__ = ("bytes", "num_blocks")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    num_blocks: int
    def __init__(self, bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class ReadStateRequest(_message.Message):
    __slots__ = ("seq_id", "checkpoint")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    checkpoint: int
    def __init__(self, seq_id: _Optional[str] = ..., checkpoint: _Optional[int] = ...) -> None: ...

class RecurrentStateLayer(_message.Message):
    __slots__ = ("index", "num_computed_tokens", "conv", "ssm")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONV_FIELD_NUMBER: _ClassVar[int]
    SSM_FIELD_NUMBER: _ClassVar[int]
    index: int
    num_computed_tokens: int
    conv: bytes
    ssm: bytes
    def __init__(self, index: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., conv: _Optional[bytes] = ..., ssm: _Optional[bytes] = ...) -> None: ...

class StateWrite(_message.Message):
    __slots__ = ("seq_id", "layer")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    layer: RecurrentStateLayer
    def __init__(self, seq_id: _Optional[str] = ..., layer: _Optional[_Union[RecurrentStateLayer, _Mapping]] = ...) -> None: ...

class WriteStateResponse(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...
