from seawall.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorageTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORAGE_TIER_UNSPECIFIED: _ClassVar[StorageTier]
    STORAGE_TIER_DRAM: _ClassVar[StorageTier]
    STORAGE_TIER_DISK: _ClassVar[StorageTier]

class KVReadPath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_READ_PATH_UNSPECIFIED: _ClassVar[KVReadPath]
    KV_READ_PATH_PE_READ: _ClassVar[KVReadPath]
    KV_READ_PATH_DE_READ: _ClassVar[KVReadPath]
STORAGE_TIER_UNSPECIFIED: StorageTier
STORAGE_TIER_DRAM: StorageTier
STORAGE_TIER_DISK: StorageTier
KV_READ_PATH_UNSPECIFIED: KVReadPath
KV_READ_PATH_PE_READ: KVReadPath
KV_READ_PATH_DE_READ: KVReadPath

class LookupRequest(_message.Message):
    __slots__ = ("block_hashes", "pin_ms")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PIN_MS_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    pin_ms: int
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., pin_ms: _Optional[int] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("num_cached_blocks", "num_dram_blocks", "num_disk_blocks", "num_state_blocks")
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_DISK_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_STATE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_cached_blocks: int
    num_dram_blocks: int
    num_disk_blocks: int
    num_state_blocks: int
    def __init__(self, num_cached_blocks: _Optional[int] = ..., num_dram_blocks: _Optional[int] = ..., num_disk_blocks: _Optional[int] = ..., num_state_blocks: _Optional[int] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("transfer_id", "block_hashes", "target", "target_block_ids", "notification_key", "timeout_ms", "transport", "path", "state_seq_id", "state_block_hash")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    STATE_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    target: _common_pb2.KVEndpoint
    target_block_ids: _containers.RepeatedScalarFieldContainer[int]
    notification_key: str
    timeout_ms: int
    transport: _common_pb2.KVTransport
    path: KVReadPath
    state_seq_id: str
    state_block_hash: int
    def __init__(self, transfer_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., target: _Optional[_Union[_common_pb2.KVEndpoint, _Mapping]] = ..., target_block_ids: _Optional[_Iterable[int]] = ..., notification_key: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., transport: _Optional[_Union[_common_pb2.KVTransport, str]] = ..., path: _Optional[_Union[KVReadPath, str]] = ..., state_seq_id: _Optional[str] = ..., state_block_hash: _Optional[int] = ...) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("status", "bytes", "num_blocks_loaded", "num_dram_blocks", "num_disk_blocks", "duration_ms", "error", "state_bytes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_LOADED_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_DISK_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.TransferStatus
    bytes: int
    num_blocks_loaded: int
    num_dram_blocks: int
    num_disk_blocks: int
    duration_ms: float
    error: str
    state_bytes: int
    def __init__(self, status: _Optional[_Union[_common_pb2.TransferStatus, str]] = ..., bytes: _Optional[int] = ..., num_blocks_loaded: _Optional[int] = ..., num_dram_blocks: _Optional[int] = ..., num_disk_blocks: _Optional[int] = ..., duration_ms: _Optional[float] = ..., error: _Optional[str] = ..., state_bytes: _Optional[int] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("transfer_id", "source", "source_block_ids", "block_hashes", "timeout_ms", "transport", "state_checkpoint", "state_tokens")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    source: _common_pb2.KVEndpoint
    source_block_ids: _containers.RepeatedScalarFieldContainer[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    timeout_ms: int
    transport: _common_pb2.KVTransport
    state_checkpoint: int
    state_tokens: int
    def __init__(self, transfer_id: _Optional[str] = ..., source: _Optional[_Union[_common_pb2.KVEndpoint, _Mapping]] = ..., source_block_ids: _Optional[_Iterable[int]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., timeout_ms: _Optional[int] = ..., transport: _Optional[_Union[_common_pb2.KVTransport, str]] = ..., state_checkpoint: _Optional[int] = ..., state_tokens: _Optional[int] = ...) -> None: ...

class StoreResponse(_message.Message):
    __slots__ = ("status", "bytes", "num_blocks_stored", "num_blocks_present", "duration_ms", "error", "state_bytes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_STORED_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_PRESENT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.TransferStatus
    bytes: int
    num_blocks_stored: int
    num_blocks_present: int
    duration_ms: float
    error: str
    state_bytes: int
    def __init__(self, status: _Optional[_Union[_common_pb2.TransferStatus, str]] = ..., bytes: _Optional[int] = ..., num_blocks_stored: _Optional[int] = ..., num_blocks_present: _Optional[int] = ..., duration_ms: _Optional[float] = ..., error: _Optional[str] = ..., state_bytes: _Optional[int] = ...) -> None: ...

class KVCacheStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "capacity_bytes", "used_bytes", "num_blocks", "bytes_read", "bytes_written", "num_evictions")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    NUM_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    tier: StorageTier
    capacity_bytes: int
    used_bytes: int
    num_blocks: int
    bytes_read: int
    bytes_written: int
    num_evictions: int
    def __init__(self, tier: _Optional[_Union[StorageTier, str]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., num_evictions: _Optional[int] = ...) -> None: ...

class PathStats(_message.Message):
    __slots__ = ("path", "num_loads", "bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NUM_LOADS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    path: KVReadPath
    num_loads: int
    bytes: int
    def __init__(self, path: _Optional[_Union[KVReadPath, str]] = ..., num_loads: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class EndpointQueue(_message.Message):
    __slots__ = ("agent_name", "queued_loads", "queued_bytes")
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUED_LOADS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BYTES_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    queued_loads: int
    queued_bytes: int
    def __init__(self, agent_name: _Optional[str] = ..., queued_loads: _Optional[int] = ..., queued_bytes: _Optional[int] = ...) -> None: ...

class KVCacheStatsResponse(_message.Message):
    __slots__ = ("hit_blocks", "miss_blocks", "num_lookups", "tiers", "paths", "queues", "queue_depth", "num_states", "state_bytes", "state_capacity_bytes", "num_disk_states", "state_disk_bytes", "state_disk_capacity_bytes", "nixl_peers")
    HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MISS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    NUM_STATES_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_DISK_STATES_FIELD_NUMBER: _ClassVar[int]
    STATE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_DISK_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NIXL_PEERS_FIELD_NUMBER: _ClassVar[int]
    hit_blocks: int
    miss_blocks: int
    num_lookups: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    paths: _containers.RepeatedCompositeFieldContainer[PathStats]
    queues: _containers.RepeatedCompositeFieldContainer[EndpointQueue]
    queue_depth: int
    num_states: int
    state_bytes: int
    state_capacity_bytes: int
    num_disk_states: int
    state_disk_bytes: int
    state_disk_capacity_bytes: int
    nixl_peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, hit_blocks: _Optional[int] = ..., miss_blocks: _Optional[int] = ..., num_lookups: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., paths: _Optional[_Iterable[_Union[PathStats, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[EndpointQueue, _Mapping]]] = ..., queue_depth: _Optional[int] = ..., num_states: _Optional[int] = ..., state_bytes: _Optional[int] = ..., state_capacity_bytes: _Optional[int] = ..., num_disk_states: _Optional[int] = ..., state_disk_bytes: _Optional[int] = ..., state_disk_capacity_bytes: _Optional[int] = ..., nixl_peers: _Optional[_Iterable[str]] = ...) -> None: ...
