from pdmesh.v1 import common_pb2 as _common_pb2
from pdmesh.v1 import generate_pb2 as _generate_pb2
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
    WORKER_ROLE_KVSTORE: _ClassVar[WorkerRole]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_PREFILL: WorkerRole
WORKER_ROLE_DECODE: WorkerRole
WORKER_ROLE_KVSTORE: WorkerRole

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "role", "model", "dtype", "block_size", "hash_algorithm", "hash_seed", "num_blocks", "free_blocks", "num_running", "num_waiting", "nixl_metadata", "kv_base_addr", "kv_block_bytes", "epoch", "compat_hash", "kv_mem_type", "kv_device_id", "used_blocks", "cached_blocks", "num_handoffs", "computed_prompt_tokens", "cached_prompt_tokens", "kv_bytes_sent", "expired_leases", "kv_transfer_seconds", "kvstore_fetched_tokens", "kvstore_offloaded_blocks", "overlapped_blocks", "queued_prefill_tokens", "prefill_us_per_token", "kvstore_us_per_token", "publishes_index", "max_num_seqs", "max_model_len", "device")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    HASH_SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NIXL_METADATA_FIELD_NUMBER: _ClassVar[int]
    KV_BASE_ADDR_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMPAT_HASH_FIELD_NUMBER: _ClassVar[int]
    KV_MEM_TYPE_FIELD_NUMBER: _ClassVar[int]
    KV_DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_LEASES_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KVSTORE_FETCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KVSTORE_OFFLOADED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OVERLAPPED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_US_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KVSTORE_US_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    model: str
    dtype: str
    block_size: int
    hash_algorithm: str
    hash_seed: int
    num_blocks: int
    free_blocks: int
    num_running: int
    num_waiting: int
    nixl_metadata: bytes
    kv_base_addr: int
    kv_block_bytes: int
    epoch: str
    compat_hash: str
    kv_mem_type: str
    kv_device_id: int
    used_blocks: int
    cached_blocks: int
    num_handoffs: int
    computed_prompt_tokens: int
    cached_prompt_tokens: int
    kv_bytes_sent: int
    expired_leases: int
    kv_transfer_seconds: float
    kvstore_fetched_tokens: int
    kvstore_offloaded_blocks: int
    overlapped_blocks: int
    queued_prefill_tokens: int
    prefill_us_per_token: float
    kvstore_us_per_token: float
    publishes_index: bool
    max_num_seqs: int
    max_model_len: int
    device: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., model: _Optional[str] = ..., dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., hash_algorithm: _Optional[str] = ..., hash_seed: _Optional[int] = ..., num_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., nixl_metadata: _Optional[bytes] = ..., kv_base_addr: _Optional[int] = ..., kv_block_bytes: _Optional[int] = ..., epoch: _Optional[str] = ..., compat_hash: _Optional[str] = ..., kv_mem_type: _Optional[str] = ..., kv_device_id: _Optional[int] = ..., used_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., num_handoffs: _Optional[int] = ..., computed_prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., kv_bytes_sent: _Optional[int] = ..., expired_leases: _Optional[int] = ..., kv_transfer_seconds: _Optional[float] = ..., kvstore_fetched_tokens: _Optional[int] = ..., kvstore_offloaded_blocks: _Optional[int] = ..., overlapped_blocks: _Optional[int] = ..., queued_prefill_tokens: _Optional[int] = ..., prefill_us_per_token: _Optional[float] = ..., kvstore_us_per_token: _Optional[float] = ..., publishes_index: _Optional[bool] = ..., max_num_seqs: _Optional[int] = ..., max_model_len: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "cache_salt", "lease_ms", "resume_token_ids", "resume_text_chars", "feed_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_TEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    FEED_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    cache_salt: str
    lease_ms: int
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    resume_text_chars: int
    feed_id: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., lease_ms: _Optional[int] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., resume_text_chars: _Optional[int] = ..., feed_id: _Optional[str] = ...) -> None: ...

class KvHandle(_message.Message):
    __slots__ = ("worker_id", "block_ids", "first_block", "cached_tokens", "compat_hash", "lease_expiry_unix_ms", "transfer_id", "worker_address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_BLOCK_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPAT_HASH_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRY_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    first_block: int
    cached_tokens: int
    compat_hash: str
    lease_expiry_unix_ms: int
    transfer_id: str
    worker_address: str
    def __init__(self, worker_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., first_block: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., compat_hash: _Optional[str] = ..., lease_expiry_unix_ms: _Optional[int] = ..., transfer_id: _Optional[str] = ..., worker_address: _Optional[str] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "cache_salt", "destination", "index_view", "stop")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    INDEX_VIEW_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    cache_salt: str
    destination: KvHandle
    index_view: IndexView
    stop: bool
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., destination: _Optional[_Union[KvHandle, _Mapping]] = ..., index_view: _Optional[_Union[IndexView, _Mapping]] = ..., stop: _Optional[bool] = ...) -> None: ...

class IndexView(_message.Message):
    __slots__ = ("tier_blocks",)
    class TierBlocksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TIER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    tier_blocks: _containers.ScalarMap[str, int]
    def __init__(self, tier_blocks: _Optional[_Mapping[str, int]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "first_logprob", "cached_tokens", "blocks_transferred", "bytes_transferred", "prefill_ms", "transfer_ms", "first_text", "first_stopped", "kv_written_inline", "first_only", "prompt_logprobs")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    BYTES_TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TEXT_FIELD_NUMBER: _ClassVar[int]
    FIRST_STOPPED_FIELD_NUMBER: _ClassVar[int]
    KV_WRITTEN_INLINE_FIELD_NUMBER: _ClassVar[int]
    FIRST_ONLY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    first_logprob: _common_pb2.TokenLogprob
    cached_tokens: int
    blocks_transferred: int
    bytes_transferred: int
    prefill_ms: float
    transfer_ms: float
    first_text: str
    first_stopped: bool
    kv_written_inline: bool
    first_only: bool
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., cached_tokens: _Optional[int] = ..., blocks_transferred: _Optional[int] = ..., bytes_transferred: _Optional[int] = ..., prefill_ms: _Optional[float] = ..., transfer_ms: _Optional[float] = ..., first_text: _Optional[str] = ..., first_stopped: _Optional[bool] = ..., kv_written_inline: _Optional[bool] = ..., first_only: _Optional[bool] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("request_id", "lease_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_ms: int
    def __init__(self, request_id: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id", "kv_written_inline")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KV_WRITTEN_INLINE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kv_written_inline: bool
    def __init__(self, request_id: _Optional[str] = ..., kv_written_inline: _Optional[bool] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "first_token_id", "first_logprob", "cached_tokens", "transfer_id", "feed_id", "kv_written_inline")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    FEED_ID_FIELD_NUMBER: _ClassVar[int]
    KV_WRITTEN_INLINE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_token_id: int
    first_logprob: _common_pb2.TokenLogprob
    cached_tokens: int
    transfer_id: str
    feed_id: str
    kv_written_inline: bool
    def __init__(self, request_id: _Optional[str] = ..., first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., cached_tokens: _Optional[int] = ..., transfer_id: _Optional[str] = ..., feed_id: _Optional[str] = ..., kv_written_inline: _Optional[bool] = ...) -> None: ...

class FeedRequest(_message.Message):
    __slots__ = ("feed_id",)
    FEED_ID_FIELD_NUMBER: _ClassVar[int]
    feed_id: str
    def __init__(self, feed_id: _Optional[str] = ...) -> None: ...

class FeedBatch(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[_generate_pb2.GenerateResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[_generate_pb2.GenerateResponse, _Mapping]]] = ...) -> None: ...
