"""The router's public ``Generation`` service and its ``MeshAdmin`` view.

Request lifecycle (one ``Generate`` call):
  1. admitted   — tokenized once, validated (INVALID_ARGUMENT), hashed into block hashes;
  2. routed     — decode worker by load; prefill worker by policy over the Redis index
                  (consistent hashing when Redis is down); short uncached prompts, or no
                  healthy prefill worker under ``fallback_local``, prefill on the decode worker;
  3. reserved   — the decode worker reserves blocks for what it does not cache (KvHandle);
  4. prefilled  — the prefill worker computes and WRITEs the KV, returns the first token;
                  if it is unreachable the reservation is released and another prefill
                  worker is tried once;
  5. decoding   — the decode worker's stream is relayed to the caller;
  6. done       — in-flight counts drop; a caller that leaves (or ``Abort``) cancels the
                  downstream calls, and every worker frees the request's blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from pdmesh.errors import InvalidRequestError
from pdmesh.kv.block_hash import BlockHasher, extra_keys_for
from pdmesh.model.config import ModelConfig
from pdmesh.rpc.convert import FINISH_NAMES, sampling_from_proto
from pdmesh.rpc.status import UnavailableError
from pdmesh.sampling_params import SamplingParams
from pdmesh.serving.clients import decode_stub, prefill_stub
from pdmesh.serving.worker_core import remaining
from pdmesh.telemetry import tracing
from pdmesh.telemetry.logging_setup import bind_request
from pdmesh.telemetry.metrics import RequestMetrics, SnapshotCollector
from pdmesh.tokenizer import Tokenizer
from pdmesh.v1 import admin_pb2, admin_pb2_grpc, common_pb2, generate_pb2, generate_pb2_grpc, worker_pb2
from services.router.config import RouterConfig
from services.router.policies import Decision, RouteContext, build_policy
from services.router.recent import RecentRoutes
from services.router.registry import Registry, WorkerHandle

log = logging.getLogger(__name__)


class RouterCore:
    """Routing state shared by the public and admin servicers."""

    def __init__(self, cfg: RouterConfig, registry: Registry, index=None) -> None:  # type: ignore[no-untyped-def]
        self.cfg = cfg
        self.registry_of_workers = registry
        self.index = index
        self.tokenizer = Tokenizer(cfg.model)
        self.model_config = ModelConfig.from_dir(cfg.model)
        self.hasher = BlockHasher(cfg.block_size, cfg.hash_seed, cfg.hash_algorithm)
        self.prefill_policy = build_policy(cfg.prefill_policy, cfg)
        self.decode_policy = build_policy(cfg.decode_policy, cfg)
        self.decisions: Counter[str] = Counter()
        self.local_prefills = 0
        self.index_fallbacks = 0
        self.prefill_retries = 0
        self.inflight: dict[str, Any] = {}
        """request id -> its current downstream gRPC call (None between calls)."""
        self.recent = RecentRoutes()
        self.aborted: set[str] = set()
        """Requests whose Abort() is unwinding their Generate stream."""
        self.index_ok_at = time.monotonic()
        self.registry = CollectorRegistry()
        self.request_metrics = RequestMetrics(self.registry, "router")
        self.registry.register(SnapshotCollector(self._metric_snapshot))

    def _metric_snapshot(self) -> list[tuple[str, str, str, float, dict[str, str]]]:
        out: list[tuple[str, str, str, float, dict[str, str]]] = []
        for key, n in list(self.decisions.items()):
            policy, _, reason = key.partition("/")
            out.append(("counter", "pdmesh_routing_decisions", "Routing decisions by policy and reason",
                        n, {"policy": policy, "reason": reason}))
        out += [
            ("counter", "pdmesh_local_prefills", "Prompts prefilled on the decode worker",
             self.local_prefills, {}),
            ("counter", "pdmesh_index_fallbacks", "Index lookups that failed (consistent hashing used)",
             self.index_fallbacks, {}),
            ("counter", "pdmesh_prefill_retries", "Requests retried on another prefill worker",
             self.prefill_retries, {}),
            ("gauge", "pdmesh_index_staleness_seconds", "Seconds since the index last answered",
             time.monotonic() - self.index_ok_at if self.index is not None else 0.0, {}),
            ("gauge", "pdmesh_requests_in_flight", "Requests the router is serving", len(self.inflight), {}),
        ]
        for w in self.registry_workers():
            out.append(("gauge", "pdmesh_worker_healthy", "1 when the worker answers and is compatible",
                        1.0 if w.healthy else 0.0, {"worker": w.worker_id, "role": w.role}))
        return out

    def registry_workers(self) -> list[WorkerHandle]:
        return list(self.registry_of_workers.workers)

    # -- admission --------------------------------------------------------------------
    def prompt_ids(self, request: generate_pb2.GenerateRequest) -> list[int]:
        kind = request.WhichOneof("input")
        if kind == "text":
            if not request.text:
                raise InvalidRequestError("text", "must not be empty")
            return self.tokenizer.encode(request.text)
        if kind == "token_ids":
            ids = list(request.token_ids.ids)
            if not ids:
                raise InvalidRequestError("token_ids", "must contain at least one token id")
            vocab = self.model_config.vocab_size
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise InvalidRequestError("token_ids", f"token id {bad} is outside the vocabulary [0, {vocab})")
            return ids
        raise InvalidRequestError("input", "set either text or token_ids")

    def check_length(self, ids: list[int], params: SamplingParams) -> None:
        limit = self.model_config.max_position_embeddings
        if len(ids) + params.max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens",
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"context of {limit}; lower max_tokens to at most {max(0, limit - len(ids))}",
            )

    # -- routing ----------------------------------------------------------------------
    async def route_prefill(
        self, ids: list[int], params: SamplingParams, exclude: set[str], ctx=None  # type: ignore[no-untyped-def]
    ) -> Decision | None:
        candidates = [w for w in self.registry_of_workers.healthy("prefill") if w.worker_id not in exclude]
        if not candidates:
            return None
        hashes = self.hasher.hash_tokens(ids, extra_keys_for(params.cache_salt))
        key = hashes[0] if hashes else bytes(str(ids[: self.cfg.block_size]), "ascii")
        lookup = tracing.start_span("index.lookup", ctx, blocks=len(hashes))
        matched, tier = await self._matched(hashes, candidates)
        lookup.set_attribute("pdmesh.index_available", matched is not None)
        if matched:  # the candidates' scores' main input: cached leading blocks per worker
            lookup.set_attribute("pdmesh.matched_blocks", ",".join(f"{w}={n}" for w, n in sorted(matched.items())))
        lookup.set_attribute("pdmesh.kvstore_blocks", tier)
        lookup.end()
        decision = self.prefill_policy.choose(
            candidates, RouteContext(hashes, key, matched, self.cfg.block_size, tier)
        )
        self.recent.remember(hashes, decision.worker.worker_id)
        return decision

    async def _matched(
        self, hashes: list, candidates: list[WorkerHandle]  # type: ignore[type-arg]
    ) -> tuple[dict[str, int] | None, int]:
        """Leading cached blocks per live prefill worker, and in the kvstore tier."""
        if self.index is None:
            return None, 0
        try:
            found = await self.index.longest_prefix(hashes)
            self.index_ok_at = time.monotonic()
        except (RedisError, OSError) as exc:
            self.index_fallbacks += 1
            if self.index_fallbacks == 1 or self.index_fallbacks % 100 == 0:
                log.warning("prefix index unreachable (%s): routing by consistent hash", exc)
            return None, 0
        epochs = {w.worker_id: w.info.epoch for w in candidates if w.info is not None}
        matched = {wid: n for (wid, epoch), n in found.items() if epochs.get(wid) == epoch}
        for wid, n in self.recent.depths(hashes).items():
            matched[wid] = max(matched.get(wid, 0), n)
        tier = max((n for (wid, _), n in found.items() if wid.startswith("kvstore")), default=0)
        return matched, tier

    def route_decode(self) -> WorkerHandle:
        candidates = self.registry_of_workers.healthy("decode")
        if not candidates:
            raise UnavailableError("no healthy decode worker; retry later")
        return self.decode_policy.choose(candidates, RouteContext([], b"", None, self.cfg.block_size)).worker


class GenerationServicer(generate_pb2_grpc.GenerationServicer):
    def __init__(self, core: RouterCore) -> None:
        self.core = core

    async def Generate(self, request, context) -> AsyncIterator[generate_pb2.GenerateResponse]:  # noqa: N802
        core = self.core
        rid = request.request_id or uuid.uuid4().hex
        if rid in core.inflight:
            raise InvalidRequestError("request_id", f"{rid!r} is already in flight")
        ids = core.prompt_ids(request)
        params = sampling_from_proto(request.sampling, cache_salt=request.cache_salt or None)
        core.check_length(ids, params)
        core.inflight[rid] = None
        timer = core.request_metrics.stream()
        span = tracing.start_span("router.generate", tracing.incoming(context), request_id=rid,
                                  model=Path(core.cfg.model).name, prompt_tokens=len(ids))
        ctx = tracing.child_context(span)
        bind_request(rid, span)
        finish = "cancelled"
        produced = 0
        try:
            async for resp in self._generate(rid, ids, params, request, context, ctx):
                produced += len(resp.token_ids)
                timer.tokens(len(resp.token_ids))
                if resp.finish_reason:
                    finish = FINISH_NAMES.get(resp.finish_reason) or "unknown"
                    timer.done(finish)
                    span.set_attribute("pdmesh.completion_tokens", resp.usage.completion_tokens)
                    span.set_attribute("pdmesh.cached_tokens", resp.usage.cached_tokens)
                yield resp
        except asyncio.CancelledError:
            if rid not in core.aborted:
                raise  # the caller went away: nothing to tell it
            # Abort(): every downstream call was cancelled on the way out (their finally
            # blocks released the KV); end the stream the way the contract says.
            finish = "abort"
            timer.done(finish)
            yield generate_pb2.GenerateResponse(
                request_id=rid, finish_reason=common_pb2.FINISH_REASON_ABORT,
                usage=generate_pb2.Usage(prompt_tokens=len(ids), completion_tokens=produced),
            )
        except Exception as exc:
            finish = "error"
            span.record_exception(exc)
            raise
        finally:
            span.set_attribute("pdmesh.finish_reason", finish)
            span.end()
            core.inflight.pop(rid, None)
            core.aborted.discard(rid)

    async def _generate(self, rid, ids, params, request, context, ctx):  # type: ignore[no-untyped-def]
        core = self.core
        cfg = core.cfg
        decode = core.route_decode()
        tried: set[str] = set()
        decode.in_flight += 1
        meta = tracing.outgoing(ctx)
        try:
            while True:
                route = tracing.start_span("router.route", ctx, decode=decode.worker_id,
                                           candidates=len(core.registry_of_workers.healthy("prefill")))
                choice = await core.route_prefill(ids, params, tried, tracing.child_context(route))
                local_reason = self._local_reason(choice, ids)
                route.set_attributes({
                    "pdmesh.policy": core.prefill_policy.name,
                    "pdmesh.prefill": choice.worker.worker_id if choice else "",
                    "pdmesh.reason": choice.reason if choice else "",
                    "pdmesh.cached_prefix_tokens": choice.cached_tokens if choice else 0,
                    "pdmesh.fallback": local_reason,
                })
                route.end()
                if local_reason:
                    core.local_prefills += 1
                    core.decisions[f"local/{local_reason}"] += 1
                    async for resp in self._relay(decode, self._track(rid, decode_stub(decode.address).GenerateLocal(
                        self._reserve_msg(rid, ids, params, request), metadata=meta,
                        timeout=remaining(context, cfg.request_timeout_s),
                    ))):
                        yield resp
                    return
                if choice is None:
                    raise RuntimeError("no prefill choice although local prefill was not chosen")
                core.decisions[f"{core.prefill_policy.name}/{choice.reason}"] += 1
                first = await self._prefill(rid, ids, params, request, context, decode, choice, meta)
                if first is None:  # the prefill worker was unreachable: try another once
                    tried.add(choice.worker.worker_id)
                    core.prefill_retries += 1
                    if len(tried) > 1:
                        raise UnavailableError(f"prefill failed on {sorted(tried)}; retry later")
                    continue
                presp, handle = first
                msg = worker_pb2.DecodeRequest(
                    request_id=rid, first_token_id=presp.first_token_id,
                    cached_tokens=max(handle.cached_tokens, presp.cached_tokens),
                    transfer_id=handle.transfer_id,
                )
                if presp.HasField("first_logprob"):
                    msg.first_logprob.CopyFrom(presp.first_logprob)
                call = self._track(rid, decode_stub(decode.address).Decode(
                    msg, metadata=meta, timeout=remaining(context, cfg.request_timeout_s)
                ))
                async for resp in self._relay(decode, call):
                    yield resp
                return
        finally:
            decode.in_flight -= 1

    def _local_reason(self, choice: Decision | None, ids: list[int]) -> str:
        cfg = self.core.cfg
        if choice is None:
            if cfg.disaggregation == "strict":
                raise UnavailableError("no healthy prefill worker (disaggregation=strict); retry later")
            return "no_prefill"
        if cfg.local_prefill_tokens and len(ids) - choice.cached_tokens < cfg.local_prefill_tokens:
            return "short_prompt"
        return ""

    def _reserve_msg(self, rid, ids, params, request) -> worker_pb2.ReserveRequest:  # type: ignore[no-untyped-def]
        return worker_pb2.ReserveRequest(
            request_id=rid, prompt_token_ids=ids, sampling=request.sampling,
            cache_salt=request.cache_salt, lease_ms=self.core.cfg.lease_ms,
        )

    async def _prefill(self, rid, ids, params, request, context, decode, choice, meta):  # type: ignore[no-untyped-def]
        """Reserve on D, prefill on P; None when P was unreachable (D's blocks released)."""
        cfg = self.core.cfg
        d_stub = decode_stub(decode.address)
        handle = await self._track(rid, d_stub.Reserve(
            self._reserve_msg(rid, ids, params, request), metadata=meta,
            timeout=remaining(context, cfg.request_timeout_s),
        ))
        prefill = choice.worker
        prefill.in_flight += 1
        released = False
        try:
            presp = await self._track(rid, prefill_stub(prefill.address).Prefill(
                worker_pb2.PrefillRequest(
                    request_id=rid, prompt_token_ids=ids, sampling=request.sampling,
                    cache_salt=request.cache_salt, destination=handle,
                ),
                metadata=meta, timeout=remaining(context, cfg.request_timeout_s),
            ))
            return presp, handle
        except grpc.aio.AioRpcError as exc:
            released = True
            await self._release(d_stub, rid)
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.core.registry_of_workers.mark_down(prefill)
                log.warning("prefill worker %s unavailable for %s: %s", prefill.worker_id, rid, exc.details())
                return None
            raise
        except BaseException:
            if not released:
                await self._release(d_stub, rid)
            raise
        finally:
            prefill.in_flight -= 1

    @staticmethod
    async def _release(stub, rid: str) -> None:  # type: ignore[no-untyped-def]
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            await asyncio.shield(stub.Release(worker_pb2.ReleaseRequest(request_id=rid), timeout=5.0))

    async def _relay(self, decode: WorkerHandle, call) -> AsyncIterator[generate_pb2.GenerateResponse]:  # type: ignore[no-untyped-def]
        try:
            async for resp in call:
                yield resp
        finally:
            call.cancel()  # no-op when finished; aborts the decode side when we leave early

    def _track(self, rid: str, call):  # type: ignore[no-untyped-def]
        """Make ``call`` the one ``Abort`` cancels; refuse to start it once aborted."""
        if rid in self.core.aborted:
            call.cancel()
            raise asyncio.CancelledError
        self.core.inflight[rid] = call
        return call

    async def Abort(self, request, context) -> generate_pb2.AbortResponse:  # noqa: N802
        # Cancel the request's current downstream call, never the handler task: cancelling
        # a task suspended inside gRPC's own send path could leave its stream unfinished.
        # The cancelled call raises CancelledError in Generate, which ends the stream with
        # FINISH_REASON_ABORT after every leg has released its KV.
        rid = request.request_id
        if rid not in self.core.inflight or rid in self.core.aborted:
            return generate_pb2.AbortResponse(aborted=False)
        self.core.aborted.add(rid)
        call = self.core.inflight.get(rid)
        if call is not None:
            call.cancel()
        return generate_pb2.AbortResponse(aborted=True)

    async def Tokenize(self, request, context) -> generate_pb2.TokenizeResponse:  # noqa: N802
        return generate_pb2.TokenizeResponse(token_ids=self.core.tokenizer.encode(request.text))

    async def ListModels(self, request, context) -> generate_pb2.ListModelsResponse:  # noqa: N802
        dtype = next((w.info.dtype for w in self.core.registry_of_workers.workers if w.info is not None), "")
        card = generate_pb2.ModelCard(
            name=Path(self.core.cfg.model).name,
            max_model_len=self.core.model_config.max_position_embeddings, dtype=dtype,
        )
        return generate_pb2.ListModelsResponse(models=[card])


class MeshAdminServicer(admin_pb2_grpc.MeshAdminServicer):
    def __init__(self, core: RouterCore) -> None:
        self.core = core

    async def ListWorkers(self, request, context) -> admin_pb2.ListWorkersResponse:  # noqa: N802
        out = admin_pb2.ListWorkersResponse()
        for w in self.core.registry_of_workers.workers:
            status = out.workers.add(address=w.address, healthy=w.healthy,
                                     refused_reason=w.refused, in_flight=w.in_flight)
            if w.info is not None:
                status.info.CopyFrom(w.info)
        return out

    async def RouterStats(self, request, context) -> admin_pb2.RouterStatsResponse:  # noqa: N802
        c = self.core
        return admin_pb2.RouterStatsResponse(
            decisions=dict(c.decisions), local_prefills=c.local_prefills,
            index_fallbacks=c.index_fallbacks, prefill_retries=c.prefill_retries,
        )

