from pdmesh.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("address", "info", "healthy", "refused_reason", "in_flight", "role", "state", "joined", "member")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    REFUSED_REASON_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    address: str
    info: _worker_pb2.WorkerInfo
    healthy: bool
    refused_reason: str
    in_flight: int
    role: str
    state: str
    joined: bool
    member: bool
    def __init__(self, address: _Optional[str] = ..., info: _Optional[_Union[_worker_pb2.WorkerInfo, _Mapping]] = ..., healthy: _Optional[bool] = ..., refused_reason: _Optional[str] = ..., in_flight: _Optional[int] = ..., role: _Optional[str] = ..., state: _Optional[str] = ..., joined: _Optional[bool] = ..., member: _Optional[bool] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers", "index")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    index: str
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., index: _Optional[str] = ...) -> None: ...

class RouterStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterStatsResponse(_message.Message):
    __slots__ = ("decisions", "local_prefills", "index_fallbacks", "prefill_retries", "decode_migrations", "refused")
    class DecisionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_RETRIES_FIELD_NUMBER: _ClassVar[int]
    DECODE_MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.ScalarMap[str, int]
    local_prefills: int
    index_fallbacks: int
    prefill_retries: int
    decode_migrations: int
    refused: int
    def __init__(self, decisions: _Optional[_Mapping[str, int]] = ..., local_prefills: _Optional[int] = ..., index_fallbacks: _Optional[int] = ..., prefill_retries: _Optional[int] = ..., decode_migrations: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...
