"""The kvstore's memory: a CPU block pool registered with NIXL, and what it says about itself.

Torch-free: the pool is a numpy buffer of ``capacity`` blocks laid out exactly as a
worker's (``KVLayout``), so a prefill worker's block and a store slot are byte-for-byte the
same descriptor.
"""

from __future__ import annotations

import uuid

import numpy as np

from pdmesh.huge_pages import host_pool
from pdmesh.kv.layout import KVLayout, resolve_dtype_name
from pdmesh.kv.transfer.base import KVRegion
from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.mesh_types import WorkerInfo
from pdmesh.model.config import ModelConfig
from pdmesh.model.source import identity_name
from services.kvstore.config import KVStoreConfig
from services.kvstore.store import BlockStore


class StorePool:
    def __init__(self, cfg: KVStoreConfig) -> None:
        mc = ModelConfig.from_dir(cfg.model)
        self.cfg = cfg
        self.layout = KVLayout.for_model(mc, cfg.block_size, resolve_dtype_name(cfg.dtype, mc))
        capacity = max(1, int(cfg.memory_gb * 2**30) // self.layout.block_bytes)
        self.epoch = uuid.uuid4().hex[:12]
        pool = host_pool(capacity * self.layout.block_bytes, touch=False)
        self.buffer = np.frombuffer(pool.buffer, dtype=np.uint8, count=pool.nbytes, offset=pool.offset)
        """Owned here for the life of the process: NIXL holds its address."""
        self.pages = pool.detail
        self.transport = NixlTransport(
            cfg.worker_id, KVRegion(int(self.buffer.ctypes.data), capacity, self.layout.block_bytes)
        )
        self.store = BlockStore(capacity)
        self.compat = self.layout.compat_hash(cfg.model, cfg.hash_algorithm, cfg.hash_seed)

    def info(self) -> WorkerInfo:
        s, t = self.store, self.transport
        return WorkerInfo(
            worker_id=self.cfg.worker_id, role="kvstore", model=identity_name(self.cfg.model),
            dtype=self.layout.dtype, block_size=self.cfg.block_size,
            hash_algorithm=self.cfg.hash_algorithm, hash_seed=self.cfg.hash_seed,
            num_blocks=s.capacity, free_blocks=len(s.free), used_blocks=len(s.stored),
            nixl_metadata=t.metadata(), kv_base_addr=t.base_addr, kv_block_bytes=t.block_bytes,
            epoch=self.epoch, compat_hash=self.compat, kv_mem_type=t.mem_type,
            num_handoffs=len(s.reservations), publishes_index=bool(self.cfg.redis_url),
        )

    def close(self) -> None:
        self.transport.close()
