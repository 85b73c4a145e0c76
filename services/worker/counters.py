"""A worker's totals since start (``Worker.counters``): what ``Info`` and ``/metrics`` report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    """Totals since start, reported by ``Info`` and ``/metrics``."""

    kv_bytes_sent: int = 0
    kvstore_fetched_tokens: int = 0
    kvstore_offloaded_blocks: int = 0
    overlapped_blocks: int = 0
    expired_leases: int = 0
    computed_prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    feed_misses: int = 0
    """Decode calls that named a token feed not open here (their tokens went on the call)."""
    kvstore_lookups: int = 0
    kvstore_lookups_skipped: int = 0
    """Prompts whose kvstore lookup was skipped: the router's index lookup listed no more
    of them in the kvstore than this worker held (``KVStoreTier.fetch``)."""
    kv_writes_inline: int = 0
    """Decode side: prompts whose KV writes all landed within their writer's call."""
    kv_writes_polled: int = 0
    """Decode side: the other prompts told with ``Decode`` or ``Release`` (a write not
    inline; on ``Decode`` also none written, or a writer that does not say)."""
