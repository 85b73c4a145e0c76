from pdmesh.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("block_hashes", "pin_ms")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PIN_MS_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    pin_ms: int
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., pin_ms: _Optional[int] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("slot_ids",)
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StoreReserveRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class StoreReserveResponse(_message.Message):
    __slots__ = ("slot_ids", "reservation_id")
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    reservation_id: str
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ..., reservation_id: _Optional[str] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("reservation_id", "ok")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    reservation_id: str
    ok: bool
    def __init__(self, reservation_id: _Optional[str] = ..., ok: _Optional[bool] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("committed",)
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    committed: int
    def __init__(self, committed: _Optional[int] = ...) -> None: ...
