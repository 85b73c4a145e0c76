"""Channels and stubs to pdmesh services, cached per address, and the calls that return
domain records instead of generated types."""

from __future__ import annotations

import asyncio
import weakref

import grpc

from pdmesh.mesh_types import WorkerInfo
from pdmesh.rpc import tls
from pdmesh.rpc.convert import info_from_proto
from pdmesh.rpc.server import MESH_CHANNEL_OPTIONS
from pdmesh.v1 import kvstore_pb2_grpc, worker_pb2, worker_pb2_grpc

_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, grpc.aio.Channel]] = (
    weakref.WeakKeyDictionary())


def channel(address: str) -> grpc.aio.Channel:
    """One channel per address for the life of the event loop (a channel is bound to the
    loop it was made on: a second ``asyncio.run`` in the same process gets its own); TLS
    (with this process's certificate as client identity) when the process is configured
    for it."""
    per_loop = _channels.setdefault(asyncio.get_running_loop(), {})
    ch = per_loop.get(address)
    if ch is None:
        files = tls.current()
        ch = (grpc.aio.secure_channel(address, files.channel_credentials(), options=MESH_CHANNEL_OPTIONS)
              if files is not None else grpc.aio.insecure_channel(address, options=MESH_CHANNEL_OPTIONS))
        per_loop[address] = ch
    return ch


def worker_stub(address: str) -> worker_pb2_grpc.WorkerStub:
    return worker_pb2_grpc.WorkerStub(channel(address))


def prefill_stub(address: str) -> worker_pb2_grpc.PrefillStub:
    return worker_pb2_grpc.PrefillStub(channel(address))


def decode_stub(address: str) -> worker_pb2_grpc.DecodeStub:
    return worker_pb2_grpc.DecodeStub(channel(address))


def kvstore_stub(address: str) -> kvstore_pb2_grpc.KVStoreStub:
    return kvstore_pb2_grpc.KVStoreStub(channel(address))


async def fetch_info(address: str, timeout: float, kvstore: bool = False) -> WorkerInfo:
    """A worker's (or the kvstore's) ``Info``; raises ``grpc.aio.AioRpcError`` when it is down."""
    stub = kvstore_stub(address) if kvstore else worker_stub(address)
    return info_from_proto(await stub.Info(worker_pb2.InfoRequest(), timeout=timeout))


def fetch_info_blocking(address: str, timeout: float) -> WorkerInfo:
    """``fetch_info`` for a caller without an event loop (a benchmark driving a mesh)."""
    with grpc.insecure_channel(address, options=MESH_CHANNEL_OPTIONS) as ch:
        return info_from_proto(worker_pb2_grpc.WorkerStub(ch).Info(worker_pb2.InfoRequest(), timeout=timeout))
