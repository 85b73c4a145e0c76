"""Router configuration (YAML, ``PDMESH_ROUTER_*`` env, flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdmesh.config import MeshContract
from pdmesh.service_config import ServerConfig

FOLLOW_LIMIT = 4.0
"""Under conditional disaggregation a prompt follows its prefix to the prefill worker
holding it until that worker is this many times past the busy rule; past it, recomputing
the prefix on the decode worker costs less than the queue."""


@dataclass(frozen=True, kw_only=True)
class RouterConfig(MeshContract, ServerConfig):
    """The router tokenizes with the model's tokenizer and refuses workers that break the
    mesh contract (model, block size, hash seed and algorithm, and dtype unless "auto")."""

    served_model_name: tuple[str, ...] = ()
    """Names clients use for the model, comma-separated: /v1/models and ListModels list
    each, responses carry the first, a request may name any (or none); empty = the hub id
    given as --model, else the folder's name."""
    prefill: tuple[str, ...] = ()
    """Prefill worker addresses (host:port, comma-separated)."""
    decode: tuple[str, ...] = ()
    """Decode worker addresses (host:port, comma-separated)."""
    redis_url: str = ""
    """The prefix index; empty = route by consistent hashing only."""
    index_mirror: bool = True
    """With redis_url: keep the prefix index in the router's memory, current from the
    index's change log (pdmesh/index/mirror.py), so a decision asks no one; lookups go to
    Redis while the mirror is not current. Off: every lookup asks Redis."""
    prefill_policy: Literal["cache_aware", "prefix_hash", "least_loaded", "round_robin"] = "cache_aware"
    """How to pick the prefill worker."""
    decode_policy: Literal["holder", "least_loaded", "round_robin", "pack"] = "holder"
    """How to pick the decode worker: holder = the one that served the conversation's
    earlier turns (it caches their blocks) unless busier than the rest, else least loaded;
    pack = fill one worker's batch before the next (decode workers sharing one machine's
    cores; ``pdmesh up`` sets it there)."""
    decode_holder_slack: int = 2
    """holder: requests in flight the holder may have beyond the least loaded worker and
    still be chosen."""
    decode_memory_s: float = 300.0
    """holder: how long the router remembers which decode worker it sent a prompt to."""
    disaggregation: Literal["strict", "fallback_local"] = "fallback_local"
    """strict: fail (UNAVAILABLE) without a healthy prefill worker; fallback_local: the
    decode worker prefills itself, counted in RouterStats."""
    local_prefill_tokens: int = 0
    """Prompts with fewer tokens than this beyond what their decode worker was sent of them
    before (its prefix cache) prefill on the decode worker (0 = never)."""
    prefill_busy_requests: int = 0
    """Conditional disaggregation: when the chosen prefill worker already has this many of
    this router's prefills in flight, prefill on the decode worker instead, so a prefill
    burst uses the decode worker's cores too (0 = never)."""
    prefill_busy_tokens: int = 0
    """Conditional disaggregation, by work: the same when the chosen prefill worker already
    has this many uncached prompt tokens queued (0 = never). Under either rule a prompt
    follows its prefix: to the decode worker when that was sent more of it, to the prefill
    worker holding it until that worker is ``FOLLOW_LIMIT`` times past the rule."""
    prefill_us_per_token: float = 150.0
    """cache_aware: cost of one prompt token on a prefill worker that has not measured its
    own yet (workers advertise what they measure; see docs/routing.md)."""
    kvstore_cost_ratio: float = 0.1
    """cache_aware: cost of a token fetched from the kvstore, as a fraction of computing
    it, until a worker has measured its own fetches."""
    route_tolerance: float = 0.3
    """cache_aware: estimates within this fraction of the fastest count as equal, and
    among them the worker holding most of the prompt wins (then rendezvous hashing): a
    prefix stays put unless that costs this much more. Measured costs are noisy; without
    it the cheapest-measuring worker takes every new prefix (the simulator's sweep is in
    docs/routing.md)."""
    require_client_cert: bool = True
    """With tls_ca: public clients of the gRPC port must present a certificate the CA
    signed (mutual TLS); false: server-side TLS, clients authenticated by api_key. Hops to
    workers stay mutual either way."""
    membership_interval_s: float = 0.5
    """With redis_url: how often the worker membership in Redis is read (workers joining or
    announcing that they leave are seen within this)."""
    info_interval_s: float = 0.5
    """How often to refresh every worker's Info (health, load, compatibility)."""
    info_timeout_s: float = 2.0
    """Deadline of one Info call."""
    down_after_failures: int = 3
    """A worker is marked down after this many Info failures in a row (a busy worker's
    slow answer must not flap it); a call that finds it unreachable marks it at once."""
    token_feed: bool = True
    """Decode workers send this router's tokens over one stream each, a message per engine
    step for all requests (pdmesh/rpc/feed_sink.py), instead of a message per token on
    every request's own call."""
    max_migrations: int = 3
    """Times one request may move to another decode worker after its worker failed."""
    stall_floor_s: float = 2.0
    """A decode stream that has sent a message waits at least this long for its next before
    it is moved to another decode worker as stalled (services/router/stalls.py)."""
    stall_factor: float = 10.0
    """... or this many times its worker's recent 99th-percentile gap, if that is longer."""
    stall_ceiling_s: float = 30.0
    """... but never longer than this."""
    stall_hold_s: float = 10.0
    """A decode worker whose stream stalled gets no new request for this long, unless one of
    its streams delivers again first."""
    max_request_mb: float = 8.0
    """Largest request the public fronts read; larger ones are refused before they are
    read into memory (gRPC RESOURCE_EXHAUSTED, HTTP 413). The default holds a prompt that
    fills a 128k-token context."""
    max_in_flight: int = 2048
    """Requests the router serves at once; more wait in a queue."""
    max_queued: int = 8192
    """Requests waiting for a slot; beyond this, RESOURCE_EXHAUSTED (HTTP 429) with a
    retry-after hint."""
    request_timeout_s: float = 600.0
    """Deadline for requests that carry none."""
    lease_ms: int = 10000
    """How long a decode worker holds a reservation whose KV has not arrived; the router
    renews it every third of that while the request waits for its prefill, so this bounds
    how long a dead router's unfinished reservations outlive it."""
    http_port: int = -1
    """OpenAI-compatible HTTP API on this port: -1 off, 0 any free port (written to
    {port_file}.http)."""
    tool_call_parser: Literal["", "hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml"] = ""
    """How tool calls are read from the model's text when a chat request's tool_choice is
    auto (vLLM's parser names; pick the one the model was trained on): hermes (Qwen 2.5,
    Hermes: <tool_call>{json}</tool_call>), llama3_json (Llama 3.1+: a JSON object),
    mistral ([TOOL_CALLS][...]), pythonic (Llama 3.2/4: [f(x=1)]), qwen3_xml (Qwen3-Coder).
    Empty: tool_choice auto is refused (required and named calls need no parser)."""
    reasoning_parser: Literal["", "deepseek_r1", "qwen3"] = ""
    """Split a reasoning model's <think>...</think> into the chat message's
    reasoning_content (services/router/reasoning.py says how each reads it); a structured
    output then holds the answer after it, not the thinking. Empty: the text is left as
    the model wrote it."""
    access_log: bool = False
    """Log one line per finished request on either front (logger pdmesh.access): its id, how
    it ended, prompt / cached / completion tokens, TTFT, total time, its prefill and decode
    workers."""
    api_key: str = ""
    """Bearer token every /v1/* HTTP route requires (also PDMESH_API_KEY); empty = none."""
