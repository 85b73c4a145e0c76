"""Channels and stubs to pdmesh services, cached per address."""

from __future__ import annotations

import grpc

from pdmesh.rpc.server import CHANNEL_OPTIONS
from pdmesh.v1 import kvstore_pb2_grpc, worker_pb2_grpc

_channels: dict[str, grpc.aio.Channel] = {}


def channel(address: str) -> grpc.aio.Channel:
    """One channel per address for the life of the process (per event loop)."""
    ch = _channels.get(address)
    if ch is None:
        ch = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        _channels[address] = ch
    return ch


def worker_stub(address: str) -> worker_pb2_grpc.WorkerStub:
    return worker_pb2_grpc.WorkerStub(channel(address))


def prefill_stub(address: str) -> worker_pb2_grpc.PrefillStub:
    return worker_pb2_grpc.PrefillStub(channel(address))


def decode_stub(address: str) -> worker_pb2_grpc.DecodeStub:
    return worker_pb2_grpc.DecodeStub(channel(address))


def kvstore_stub(address: str) -> kvstore_pb2_grpc.KVStoreStub:
    return kvstore_pb2_grpc.KVStoreStub(channel(address))

