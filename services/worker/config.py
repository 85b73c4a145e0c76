"""Configuration of a prefill or decode worker (YAML, ``PDMESH_WORKER_*`` env, flags)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

from pdmesh.config import EngineArgs, EngineConfig
from pdmesh.service_config import ServerConfig


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(EngineArgs, ServerConfig):
    role: Literal["prefill", "decode"] = "decode"
    """Which half of the disaggregated pipeline this worker serves."""
    worker_id: str = ""
    """Unique name, also the NIXL agent name; empty = "{role}-{port}"."""
    redis_url: str = ""
    """Join the mesh's membership here (any worker) and publish prefix-cache events
    (prefill workers); empty = reachable only through a router's static lists."""
    leave_notice_s: float = 1.5
    """On SIGTERM with a redis_url: after leaving the membership, keep serving this long so
    routers (polling every membership_interval_s) stop sending before the drain starts."""
    kvstore: str = ""
    """Address of the kvstore tier (prefill workers offload to and fetch from it)."""
    lease_ms: int = 30000
    """Default lifetime of a decode reservation whose KV has not arrived."""
    transfer_timeout_s: float = 30.0
    """Longest a KV write may take before the prefill fails with ABORTED."""
    warmup_tokens: int = -1
    """Before serving, compute one prompt of this many tokens and free it, so the first
    requests do not pay for memory the process touches for the first time
    (``pdmesh/engine/warm_up.py``); -1 = the step's token budget
    (max_num_batched_tokens), 0 = none."""
    kv_copy_priority: Literal["realtime", "normal"] = "realtime"
    """realtime: the KV copies this worker starts (a prefill worker's writes to the decode
    worker and the kvstore; its fetches) run at real-time priority for as long as each copy
    takes, so the engines' threads cannot preempt them midway (``copy_priority.py``; needs
    CAP_SYS_NICE or ``ulimit -r 1``, else logged at start-up and run as normal); normal: at
    the event loop thread's own priority."""
    core_share: str = ""
    """PATH:SLOT of the file where workers that split this machine's cores lend them to
    each other while idle (``pdmesh up`` sets it; needs ``threads``); empty = a fixed
    thread count."""

    def resolved_id(self, port: int) -> str:
        return self.worker_id or f"{self.role}-{port}"

    def engine_config(self) -> EngineConfig:
        config = super().engine_config()
        if self.core_share:  # a lone prompt computes on every core it borrows: probe there
            return dataclasses.replace(config, probe_threads=os.cpu_count() or None)
        return config
