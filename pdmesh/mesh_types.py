"""Records that describe the mesh to its own code, free of generated protobuf types.

Servicers and RPC clients convert to and from the wire (``pdmesh/rpc/convert.py``); below
them, routing, transfers and bookkeeping see only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Role = Literal["prefill", "decode", "kvstore", ""]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker (or the kvstore) says about itself: identity, contract, capacity, load."""

    worker_id: str = ""
    """Unique name, also its NIXL agent name."""
    role: Role = ""
    model: str = ""
    """The model's identity (``pdmesh/model/source.py``: folder name, or ORG/NAME@COMMIT)."""
    dtype: str = ""
    block_size: int = 0
    hash_algorithm: str = ""
    hash_seed: int = 0
    num_blocks: int = 0
    free_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    nixl_metadata: bytes = b""
    """Opaque NIXL agent metadata for ``add_remote_agent``."""
    kv_base_addr: int = 0
    kv_block_bytes: int = 0
    epoch: str = ""
    """Changes on every restart; index entries of an older epoch are stale."""
    compat_hash: str = ""
    """Digest of everything two processes must agree on to exchange KV."""
    kv_mem_type: str = "DRAM"
    kv_device_id: int = 0
    used_blocks: int = 0
    cached_blocks: int = 0
    num_handoffs: int = 0
    computed_prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    kv_bytes_sent: int = 0
    expired_leases: int = 0
    kv_transfer_seconds: float = 0.0
    kvstore_fetched_tokens: int = 0
    kvstore_offloaded_blocks: int = 0
    overlapped_blocks: int = 0
    queued_prefill_tokens: int = 0
    """Prompt tokens admitted and not yet computed: the work a new prompt waits behind."""
    prefill_us_per_token: float = 0.0
    """Recent cost of one prompt token in prefill steps (0 until measured)."""
    kvstore_us_per_token: float = 0.0
    """Recent cost of one prompt token fetched from the kvstore (0 until measured)."""
    publishes_index: bool = False
    """The kvstore publishes what it holds into the prefix index (a prefill worker may then
    trust the router's index lookup instead of asking the kvstore)."""
    max_num_seqs: int = 0
    """The most sequences one engine step runs (0: not said, an older worker)."""
    max_model_len: int = 0
    """The longest sequence its engine admits (0: not said, an older worker)."""
    device: str = ""
    """Where it computes and the GPUs it was given ("cuda:0 (CUDA_VISIBLE_DEVICES=2)", "cpu")."""


@dataclass(frozen=True, slots=True)
class KvDestination:
    """Where a prompt's KV goes: a decode worker's reservation (the router passes it on)."""

    worker_id: str
    """The decode worker, also its NIXL agent name."""
    worker_address: str
    """Its gRPC address (for its Info: NIXL metadata, pool layout)."""
    block_ids: tuple[int, ...] = field(default=())
    """Destination blocks for prompt blocks ``first_block`` onward."""
    first_block: int = 0
    """Earlier prompt blocks are cached on the decode worker already."""
    cached_tokens: int = 0
    compat_hash: str = ""
    lease_expiry_unix_ms: int = 0
    transfer_id: str = ""
    """Names this reservation (request id and a nonce); ``Decode`` must carry it."""
