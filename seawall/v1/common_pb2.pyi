from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class FreeThought(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FREE_THOUGHT_UNSPECIFIED: _ClassVar[FreeThought]
    FREE_THOUGHT_REQUIRED: _ClassVar[FreeThought]
    FREE_THOUGHT_OPTIONAL: _ClassVar[FreeThought]
    FREE_THOUGHT_HARMONY: _ClassVar[FreeThought]

class KVDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_DTYPE_UNSPECIFIED: _ClassVar[KVDtype]
    KV_DTYPE_FLOAT32: _ClassVar[KVDtype]
    KV_DTYPE_FLOAT16: _ClassVar[KVDtype]
    KV_DTYPE_BFLOAT16: _ClassVar[KVDtype]
    KV_DTYPE_FP8_E4M3: _ClassVar[KVDtype]
    KV_DTYPE_FP8_E5M2: _ClassVar[KVDtype]

class MemoryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_TYPE_UNSPECIFIED: _ClassVar[MemoryType]
    MEMORY_TYPE_DRAM: _ClassVar[MemoryType]
    MEMORY_TYPE_VRAM: _ClassVar[MemoryType]
    MEMORY_TYPE_FILE: _ClassVar[MemoryType]

class KVTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_TRANSPORT_UNSPECIFIED: _ClassVar[KVTransport]
    KV_TRANSPORT_NIXL: _ClassVar[KVTransport]
    KV_TRANSPORT_GRPC: _ClassVar[KVTransport]

class TransferStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSFER_STATUS_UNSPECIFIED: _ClassVar[TransferStatus]
    TRANSFER_STATUS_DONE: _ClassVar[TransferStatus]
    TRANSFER_STATUS_FAILED: _ClassVar[TransferStatus]
    TRANSFER_STATUS_TIMED_OUT: _ClassVar[TransferStatus]
    TRANSFER_STATUS_ABORTED: _ClassVar[TransferStatus]
    TRANSFER_STATUS_NOT_FOUND: _ClassVar[TransferStatus]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_ERROR: FinishReason
FREE_THOUGHT_UNSPECIFIED: FreeThought
FREE_THOUGHT_REQUIRED: FreeThought
FREE_THOUGHT_OPTIONAL: FreeThought
FREE_THOUGHT_HARMONY: FreeThought
KV_DTYPE_UNSPECIFIED: KVDtype
KV_DTYPE_FLOAT32: KVDtype
KV_DTYPE_FLOAT16: KVDtype
KV_DTYPE_BFLOAT16: KVDtype
KV_DTYPE_FP8_E4M3: KVDtype
KV_DTYPE_FP8_E5M2: KVDtype
MEMORY_TYPE_UNSPECIFIED: MemoryType
MEMORY_TYPE_DRAM: MemoryType
MEMORY_TYPE_VRAM: MemoryType
MEMORY_TYPE_FILE: MemoryType
KV_TRANSPORT_UNSPECIFIED: KVTransport
KV_TRANSPORT_NIXL: KVTransport
KV_TRANSPORT_GRPC: KVTransport
TRANSFER_STATUS_UNSPECIFIED: TransferStatus
TRANSFER_STATUS_DONE: TransferStatus
TRANSFER_STATUS_FAILED: TransferStatus
TRANSFER_STATUS_TIMED_OUT: TransferStatus
TRANSFER_STATUS_ABORTED: TransferStatus
TRANSFER_STATUS_NOT_FOUND: TransferStatus

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "logprobs", "include_stop_str_in_output", "prompt_logprobs", "logit_bias", "allowed_token_ids", "structured_output", "keep_special_tokens", "bad_words", "pooling")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    KEEP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    min_tokens: int
    logprobs: int
    include_stop_str_in_output: bool
    prompt_logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    structured_output: StructuredOutput
    keep_special_tokens: bool
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    pooling: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., logprobs: _Optional[int] = ..., include_stop_str_in_output: _Optional[bool] = ..., prompt_logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., keep_special_tokens: _Optional[bool] = ..., bad_words: _Optional[_Iterable[str]] = ..., pooling: _Optional[bool] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "regex", "choice", "grammar", "free_thought")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    FREE_THOUGHT_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    regex: str
    choice: Choices
    grammar: str
    free_thought: FreeThought
    def __init__(self, json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., free_thought: _Optional[_Union[FreeThought, str]] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "rank")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    rank: int
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., rank: _Optional[int] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("sampled", "top")
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    sampled: TokenLogprob
    top: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, sampled: _Optional[_Union[TokenLogprob, _Mapping]] = ..., top: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class KVLayout(_message.Message):
    __slots__ = ("block_size", "num_layers", "num_kv_heads", "head_dim", "dtype", "bytes_per_block", "regions_per_block", "region_block_bytes", "kv_parts")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    REGIONS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    REGION_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_PARTS_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: KVDtype
    bytes_per_block: int
    regions_per_block: int
    region_block_bytes: int
    kv_parts: int
    def __init__(self, block_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[_Union[KVDtype, str]] = ..., bytes_per_block: _Optional[int] = ..., regions_per_block: _Optional[int] = ..., region_block_bytes: _Optional[int] = ..., kv_parts: _Optional[int] = ...) -> None: ...

class MemoryRegion(_message.Message):
    __slots__ = ("addr", "length", "device_id", "mem_type")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    MEM_TYPE_FIELD_NUMBER: _ClassVar[int]
    addr: int
    length: int
    device_id: int
    mem_type: MemoryType
    def __init__(self, addr: _Optional[int] = ..., length: _Optional[int] = ..., device_id: _Optional[int] = ..., mem_type: _Optional[_Union[MemoryType, str]] = ...) -> None: ...

class NixlAgentMetadata(_message.Message):
    __slots__ = ("agent_name", "agent_metadata", "regions")
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_metadata: bytes
    regions: _containers.RepeatedCompositeFieldContainer[MemoryRegion]
    def __init__(self, agent_name: _Optional[str] = ..., agent_metadata: _Optional[bytes] = ..., regions: _Optional[_Iterable[_Union[MemoryRegion, _Mapping]]] = ...) -> None: ...

class KVEndpoint(_message.Message):
    __slots__ = ("agent_name", "agent_metadata", "kv_layout", "grpc_address")
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_metadata: NixlAgentMetadata
    kv_layout: KVLayout
    grpc_address: str
    def __init__(self, agent_name: _Optional[str] = ..., agent_metadata: _Optional[_Union[NixlAgentMetadata, _Mapping]] = ..., kv_layout: _Optional[_Union[KVLayout, _Mapping]] = ..., grpc_address: _Optional[str] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class MeetPeersRequest(_message.Message):
    __slots__ = ("peers", "timeout_ms")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[KVEndpoint]
    timeout_ms: int
    def __init__(self, peers: _Optional[_Iterable[_Union[KVEndpoint, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class MeetPeersResponse(_message.Message):
    __slots__ = ("agent_names",)
    AGENT_NAMES_FIELD_NUMBER: _ClassVar[int]
    agent_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_names: _Optional[_Iterable[str]] = ...) -> None: ...
