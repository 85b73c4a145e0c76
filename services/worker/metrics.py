"""A worker's scrape-time gauges and counters (engine state and transfer totals)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pdmesh.engine.async_engine import AsyncLLMEngine
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.kv.transfer.runner import TransferRunner
    from services.worker.config import WorkerConfig
    from services.worker.counters import Counters


class ScrapedWorker(Protocol):
    """What a scrape reads of the worker (``Worker``), without importing it."""

    cfg: WorkerConfig
    engine: LLMEngine
    async_engine: AsyncLLMEngine
    counters: Counters
    transfers: TransferRunner

Sample = tuple[str, str, str, Any, dict[str, str]]


def worker_snapshot(worker: ScrapedWorker) -> list[Sample]:
    """Call under the engine lock."""
    eng, c = worker.engine, worker.counters
    s = eng.pool.stats()
    role: dict[str, str] = {"role": worker.cfg.role}
    prompt = c.cached_prompt_tokens + c.computed_prompt_tokens
    blocks = "KV blocks by state"
    tokens = "Prompt tokens by source"
    lookups = "Prefill kvstore lookups: asked, or skipped on the router's index lookup"
    received = ("Prompts whose KV landing this decode worker was told of (with Decode, or Release when the "
                "first token ended the request): inline (every write within its writer's call) or polled (the "
                "rest: a write that needed this worker, none, or a writer that does not say)")
    return [
        ("gauge", "pdmesh_kv_blocks", blocks, s.used, {**role, "state": "used"}),
        ("gauge", "pdmesh_kv_blocks", blocks, s.free, {**role, "state": "free"}),
        ("gauge", "pdmesh_kv_blocks", blocks, s.cached, {**role, "state": "cached"}),
        ("gauge", "pdmesh_orphan_kv_blocks", "Blocks in use owned by no live request (a leak if > 0)",
         eng.orphan_blocks(), role),
        ("gauge", "pdmesh_queue_depth", "Requests waiting for admission", eng.scheduler.num_waiting, role),
        ("gauge", "pdmesh_running_requests", "Requests running", len(eng.scheduler.running), role),
        ("counter", "pdmesh_preemptions", "Sequences preempted for want of KV blocks (computed again later)",
         eng.scheduler.num_preemptions, role),
        ("gauge", "pdmesh_kv_handoffs", "Reservations awaiting KV / KV held for a write",
         eng.handoff.count, role),
        ("counter", "pdmesh_prompt_tokens", tokens, c.computed_prompt_tokens, {**role, "source": "computed"}),
        ("counter", "pdmesh_prompt_tokens", tokens, c.cached_prompt_tokens, {**role, "source": "cached"}),
        ("counter", "pdmesh_prompt_tokens", tokens, c.kvstore_fetched_tokens, {**role, "source": "kvstore"}),
        ("gauge", "pdmesh_prefix_cache_hit_rate", "Cached / all prompt tokens since start",
         c.cached_prompt_tokens / prompt if prompt else 0.0, role),
        ("counter", "pdmesh_kv_transfer_bytes", "KV bytes written to decode workers", c.kv_bytes_sent, role),
        ("counter", "pdmesh_kv_transfer_seconds", "Time with a KV write in flight",
         worker.transfers.writing.seconds, role),
        ("counter", "pdmesh_kv_overlapped_blocks", "Blocks sent while later chunks computed",
         c.overlapped_blocks, role),
        ("counter", "pdmesh_expired_leases", "Reservations freed because their KV never came",
         c.expired_leases, role),
        ("counter", "pdmesh_feed_misses", "Decode calls naming a token feed not open here (streamed on the call)",
         c.feed_misses, role),
        ("counter", "pdmesh_kv_writes_received", received, c.kv_writes_inline, {**role, "path": "inline"}),
        ("counter", "pdmesh_kv_writes_received", received, c.kv_writes_polled, {**role, "path": "polled"}),
        ("counter", "pdmesh_kvstore_lookups", lookups, c.kvstore_lookups, {**role, "outcome": "asked"}),
        ("counter", "pdmesh_kvstore_lookups", lookups, c.kvstore_lookups_skipped, {**role, "outcome": "skipped"}),
        *_spec_samples(worker, role),
        *_core_share_samples(worker, role),
    ]


def _core_share_samples(worker: ScrapedWorker, role: dict[str, str]) -> list[Sample]:
    share = worker.async_engine.core_share
    if share is None:
        return []
    return [
        ("gauge", "pdmesh_engine_threads", "Threads of the engine's last step (own share + borrowed)",
         share.threads, role),
        ("counter", "pdmesh_borrowed_core_steps", "Engine steps run on cores idle peers lent",
         share.lent_steps, role),
    ]


def _spec_samples(worker: ScrapedWorker, role: dict[str, str]) -> list[Sample]:
    spec = worker.engine.speculator
    if spec is None:
        return []
    st = spec.stats
    return [
        ("counter", "pdmesh_spec_draft_tokens", "Draft tokens verified (speculative decoding)",
         st.draft_tokens, role),
        ("counter", "pdmesh_spec_accepted_tokens", "Draft tokens accepted", st.accepted_tokens, role),
        ("histogram", "pdmesh_spec_acceptance_length", "Drafts accepted per verification step",
         (st.accepted_counts, float(st.accepted_tokens)), role),
    ]
