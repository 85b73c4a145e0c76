"""The router's shared state: workers, the prefix index, policies, counters, live flows.

Admission (tokenize once, validate, hash) and the two routing decisions live here; what
happens to one request afterwards is its ``RequestFlow`` (``request/flow.py``), which sees
the router through ``request/mesh.py``'s ``RouterMesh``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from pdmesh.errors import InvalidRequestError, UnavailableError
from pdmesh.kv.block_hash import BlockHash, BlockHasher, extra_keys_for
from pdmesh.model.config import ModelConfig
from pdmesh.model.source import display_name
from pdmesh.rpc.feed_sink import Feeds
from pdmesh.rpc.status import for_client
from pdmesh.sampling_params import SamplingParams
from pdmesh.structured.grammars import Grammars
from pdmesh.telemetry import tracing
from pdmesh.telemetry.metrics import RequestMetrics, SnapshotCollector
from pdmesh.tokenizer import Tokenizer
from services.router.admission import AdmissionGate
from services.router.config import FOLLOW_LIMIT, RouterConfig
from services.router.metrics import router_snapshot
from services.router.policies import Decision, RouteContext, build_policy
from services.router.prefill_routing import IndexSeen, PrefillRouter
from services.router.recent import RecentRoutes
from services.router.registry import Registry
from services.router.request.completions import Completions
from services.router.request.flow import RequestFlow
from services.router.request.stats import RouterStats
from services.router.worker_handle import WorkerHandle

log = logging.getLogger(__name__)
MAX_REQUEST_ID_CHARS = 256


def _prefill_holds(w: WorkerHandle, prompt_tokens: int) -> bool:
    """A prefill worker computes the prompt and samples its first token: that sequence."""
    return w.holds(prompt_tokens + 1)


class Router:
    def __init__(self, cfg: RouterConfig, workers: Registry, index: Any = None) -> None:
        self.cfg = cfg
        self.workers = workers
        self.index = index
        """``MirroredIndex`` or ``PrefixIndex`` over Redis, or None (consistent hashing only)."""
        self.tokenizer = Tokenizer(cfg.model)
        self.model_config = ModelConfig.from_dir(cfg.model)
        self.listed_names = list(cfg.served_model_name) or [display_name(cfg.model)]
        """The model's names as /v1/models and ListModels list them (``served_model_name``;
        the first is the one responses carry)."""
        path = Path(cfg.model)
        self.served_names = frozenset([*self.listed_names, path.name, cfg.model, str(path.resolve())])
        """Every name a request may give the model: the listed ones, the folder's name, its path."""
        self.hasher = BlockHasher(cfg.block_size, cfg.hash_seed, cfg.hash_algorithm)
        self.max_token_bytes = max(len(t.encode()) for t in self.tokenizer.vocab_strings())
        """An upper bound on the bytes of text one token covers (for the cheap size check)."""
        self._tokenizer_pool = ThreadPoolExecutor(2, thread_name_prefix="pdmesh-tokenize")
        self.grammars = Grammars(self.tokenizer.json_text(), self.model_config.vocab_size,
                                 self.model_config.end_ids(self.tokenizer.eos_token_id))
        """Structured outputs compiled here first, so one that does not compile is refused
        before any worker is chosen (the workers compile their own copy)."""
        self.prefill_router = PrefillRouter(build_policy(cfg.prefill_policy, cfg), index, cfg.block_size)
        self.decode_policy = build_policy(cfg.decode_policy, cfg)
        self.decode_recent = RecentRoutes(ttl_s=cfg.decode_memory_s)
        """Which decode worker each prompt block was last sent to (``holder`` policy)."""
        self.stats = RouterStats()
        """What requests did (decisions, local prefills, retries, migrations, late give-backs)."""
        self.flows: dict[str, Completions] = {}
        """request id -> its live completions (what ``Abort`` reaches)."""
        self.admission = AdmissionGate(cfg.max_in_flight, cfg.max_queued)
        self.feeds = Feeds(cfg.token_feed)
        """Token feeds from the decode workers."""
        self.metrics = CollectorRegistry()
        self.request_metrics = RequestMetrics(self.metrics, "router")
        self.metrics.register(SnapshotCollector(lambda: router_snapshot(self)))

    # -- admission --------------------------------------------------------------------
    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, off the event loop, after a size check that needs no
        tokenizer: no token covers more than ``max_token_bytes`` bytes, so a text longer than
        the context times that cannot fit and is refused at once (a 40 MB prompt must not
        stall every other stream while it is tokenized)."""
        if not text:
            raise InvalidRequestError("text", "must not be empty")
        limit = self.model_config.max_position_embeddings
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit * self.max_token_bytes:
            raise InvalidRequestError(
                "text", f"{size} bytes cannot fit the model's context of {limit} tokens "
                f"(at most {limit * self.max_token_bytes} bytes); shorten the prompt")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizer_pool, self.tokenizer.encode, text, add_special_tokens)

    async def prompt_ids_async(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return await self.tokenize(prompt, add_special_tokens)
        return self.prompt_ids(prompt)

    async def chat_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                       tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A conversation rendered with the model's chat template (and the tools it may
        call) and tokenized without added specials (the template writes BOS itself): the
        prompt of a chat on either front."""
        if not messages:
            raise InvalidRequestError("messages", "must contain at least one message")
        rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt, tools)
        return await self.tokenize(rendered, add_special_tokens=False)

    def prompt_ids(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("text", "must not be empty")
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if not prompt:
            raise InvalidRequestError("token_ids", "must contain at least one token id")
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError("token_ids", f"token id {bad} is outside the vocabulary [0, {vocab})")
        return list(prompt)

    def check_length(self, ids: list[int], params: SamplingParams) -> None:
        limit = self.model_config.max_position_embeddings
        if len(ids) + params.max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens",
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"context of {limit}; lower max_tokens to at most {max(0, limit - len(ids))}",
            )

    async def generate(self, request_id: str, ids: list[int], params: SamplingParams,
                       deadline: float, trace: Any = None) -> AsyncIterator[tuple[int, Any]]:
        """Run a validated request through the mesh: ``(completion index, GenerateResponse)``
        for each of its ``n`` completions, registered for ``Abort`` while it runs."""
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequestError("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters, "
                                      f"got {len(request_id)}")
        if request_id in self.flows:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in flight")
        await self.check_structured(params)
        n, one = params.n, params.replace(n=1)
        flows = [
            RequestFlow(self, request_id if n == 1 else f"{request_id}#{i}", ids,
                        one if params.seed is None else one.replace(seed=(params.seed + i) % 2**63),
                        deadline, trace)
            for i in range(n)
        ]
        group = self.flows[request_id] = Completions(request_id, flows)
        try:
            async with self.admission.slot(max(0.0, deadline - asyncio.get_running_loop().time())):
                async for item in group.stream():
                    yield item
        except grpc.aio.AioRpcError as exc:
            raise for_client(exc) from exc
        finally:
            self.flows.pop(request_id, None)

    async def check_structured(self, params: SamplingParams) -> None:
        """Compile the request's structured output (off the event loop; cached), so one
        that does not compile is an ``InvalidRequestError`` before any worker is chosen."""
        if params.structured_output is not None:
            await asyncio.get_running_loop().run_in_executor(
                self._tokenizer_pool, self.grammars.compile, params.structured_output)

    # -- routing ----------------------------------------------------------------------
    def prompt_hashes(self, ids: list[int], params: SamplingParams) -> list[BlockHash]:
        """The prompt's chained block hashes (its cache salt included): computed once per
        request for both routing decisions."""
        return self.hasher.hash_tokens(ids, extra_keys_for(params.cache_salt))

    async def route_prefill(self, ids: list[int], hashes: list[BlockHash], exclude: set[str],
                            ctx: Any = None) -> tuple[Decision | None, IndexSeen]:
        """The prefill worker (None: no candidate) and what the index said of the prompt."""
        candidates = [w for w in self.workers.healthy("prefill") if _prefill_holds(w, len(ids))]
        if exclude:  # a retry after a failure: rare, and a pass over the workers
            candidates = [w for w in candidates if w.worker_id not in exclude]
        if not candidates:
            return None, IndexSeen()
        key = hashes[0] if hashes else bytes(str(ids[: self.cfg.block_size]), "ascii")
        lookup = tracing.start_span("index.lookup", ctx, blocks=len(hashes))
        decision, seen = await self.prefill_router.choose(hashes, key, len(ids), candidates,
                                                          remember=False)  # settle_route does
        lookup.set_attribute("pdmesh.index_available", seen.matched is not None)
        if seen.matched:  # the candidates' scores' main input: cached leading blocks per worker
            lookup.set_attribute("pdmesh.matched_blocks",
                                 ",".join(f"{w}={n}" for w, n in sorted(seen.matched.items())))
        lookup.set_attribute("pdmesh.kvstore_blocks", seen.tier)
        lookup.end()
        return decision, seen

    def unservable(self) -> str:
        """Why the mesh cannot serve a request now ("" when it can)."""
        if not self.workers.healthy("decode"):
            return "no healthy decode worker"
        if not self.workers.healthy("prefill") and self.cfg.disaggregation == "strict":
            return "no healthy prefill worker (disaggregation=strict)"
        return ""

    def route_decode(self, hashes: list[BlockHash], exclude: set[str] | frozenset[str] = frozenset(),
                     tokens: int = 0) -> tuple[WorkerHandle, int]:
        """By policy, over what each decode worker was recently sent of this prompt (a
        decode worker keeps prompts' blocks as prefix cache; the router remembers where
        it sent them): the worker, and the prompt tokens it was sent before this request.
        Only workers that admit ``tokens`` (prompt + max_tokens: ``WorkerHandle.holds``) are
        candidates while any does; when none does, one of them says so precisely
        (INVALID_ARGUMENT)."""
        candidates = [w for w in self.workers.healthy("decode") if w.worker_id not in exclude]
        if not candidates:
            raise UnavailableError("no healthy decode worker; retry later")
        candidates = [w for w in candidates if w.holds(tokens)] or candidates
        held = self.decode_recent.depths(hashes)
        choice = self.decode_policy.choose(
            candidates, RouteContext(hashes, hashes[0] if hashes else b"", held, self.cfg.block_size))
        self.stats.decisions[f"decode/{choice.reason}"] += 1
        if hashes:
            self.decode_recent.remember(hashes, choice.worker.worker_id)
        return choice.worker, held.get(choice.worker.worker_id, 0) * self.cfg.block_size

    def settle_route(self, choice: Decision | None, local_reason: str, hashes: list[BlockHash]) -> None:
        """Count a prefill decision for RouterStats and /metrics, by policy and reason, and
        remember the prompt on the prefill worker only if it goes there: remembered there
        while it prefilled on its decode worker, the next prompt of its prefix would be
        sent to compute that prefix again."""
        if local_reason:
            self.stats.local_prefills += 1
            self.stats.decisions[f"local/{local_reason}"] += 1
        elif choice is not None:
            self.stats.decisions[f"{self.prefill_router.policy.name}/{choice.reason}"] += 1
            self.prefill_router.recent.remember(hashes, choice.worker.worker_id)

    def local_reason(self, choice: Decision | None, ids: list[int], decode_held: int = 0,
                     decode: WorkerHandle | None = None) -> str:
        """Why this request prefills on its decode worker ("" = it does not).
        ``decode_held``: leading prompt tokens sent to its decode worker before it;
        ``decode``: that worker, whose queued prompt tokens the busy rule weighs."""
        cfg = self.cfg
        if choice is None:
            too_long = self.too_long_for_prefill(len(ids))
            if cfg.disaggregation == "strict":
                if too_long:
                    raise InvalidRequestError("prompt", f"{too_long} (disaggregation=strict); shorten the prompt")
                raise UnavailableError("no healthy prefill worker (disaggregation=strict); retry later")
            return "too_long_for_prefill" if too_long else "no_prefill"
        # Short by what the decode worker would compute: a prompt whose long prefix only
        # the prefill worker holds computes a few tokens there and sends its KV, where
        # "local" meant the decode worker computing the whole prefix again.
        if cfg.local_prefill_tokens and len(ids) - decode_held < cfg.local_prefill_tokens:
            return "short_prompt"
        if not (cfg.prefill_busy_requests or cfg.prefill_busy_tokens):
            return ""
        # A prompt follows its prefix, or the prefix is computed on both workers: spilled
        # by the busy rule while its KV was still on its way, a group of prompts sharing a
        # system prompt cached 0.69 of its tokens against 0.78 (docs/performance/log.md §14).
        if decode_held > choice.cached_tokens:
            return "decode_holds"
        load = self._prefill_load(choice.worker)
        if choice.cached_tokens and load < FOLLOW_LIMIT:
            return ""
        if load < 1:
            return ""
        # Busy is not enough: the decode worker must be the shorter wait, in prompt tokens
        # queued plus what this prompt computes. Without it a burst sent everything past the
        # rule there (4,608 of 6,656 prompt tokens of 64 shared-prefix prompts on 1 + 1), and
        # the prefill worker sat idle while the decode worker caught up.
        if decode is not None:
            here = decode.queued_tokens + len(ids) - decode_held
            there = choice.worker.queued_tokens + len(ids) - choice.cached_tokens
            if here >= there:
                return ""
        return "prefill_busy"

    def too_long_for_prefill(self, prompt_tokens: int) -> str:
        """Why no healthy prefill worker can hold a prompt of ``prompt_tokens`` ("" when one
        can, or none is healthy). Such a prompt prefills on its decode worker, whose pool or
        context may be larger, instead of failing with "shorten the prompt" at a prefill worker."""
        healthy = self.workers.healthy("prefill")
        if not healthy or any(_prefill_holds(w, prompt_tokens) for w in healthy):
            return ""
        longest = max(w.capacity for w in healthy) - 1  # the first token takes the last place
        return (f"{prompt_tokens} tokens do not fit any prefill worker (the longest prompt one "
                f"admits, by its context and KV pool, has {longest})")

    def _prefill_load(self, w: WorkerHandle) -> float:
        """How far the prefill worker is along the busy rules (>= 1: busy)."""
        cfg = self.cfg
        return max(w.in_flight / cfg.prefill_busy_requests if cfg.prefill_busy_requests else 0.0,
                   w.queued_tokens / cfg.prefill_busy_tokens if cfg.prefill_busy_tokens else 0.0)
