"""The synchronous engine: add requests, ``step()`` until done, abort at any time.

One step = schedule → run the model → sample → append tokens, detokenize, check stops →
register computed blocks as prefix cache → free finished sequences → render outputs.
Every path that ends a sequence goes through ``Scheduler.finish``, which frees its
blocks, so a finished, failed or aborted request never keeps a KV block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from pdmesh.allocator import keep_freed_memory
from pdmesh.attention.select import build_backend
from pdmesh.config import EngineArgs, EngineConfig
from pdmesh.engine.admission import Admission
from pdmesh.engine.forks import expand_forks, fork_siblings
from pdmesh.engine.handoff import KVHandoff
from pdmesh.engine.kv_sizing import (
    check_memory_before_loading,
    device_memory,
    pool_blocks,
)
from pdmesh.engine.model_runner import CudaGraphSizes, ModelRunner, StepResult
from pdmesh.engine.output import RequestState
from pdmesh.engine.prompt_logprobs import record_prompt_logprobs
from pdmesh.engine.resume import Resume
from pdmesh.engine.sampler import Sampler
from pdmesh.engine.scheduler import Scheduler, SchedulerOutput
from pdmesh.engine.spec.speculator import Verified, build_speculator
from pdmesh.engine.step_cost import TokenCost
from pdmesh.engine.step_log import StepLog, ThreadUsage
from pdmesh.engine.token_commit import TokenCommit
from pdmesh.errors import InvalidRequestError, UnknownRequestError
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.block_pool import BlockPool, BlockPoolStats
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.kv.layout import KVLayout
from pdmesh.model.config import ModelConfig
from pdmesh.model.loader import load_model
from pdmesh.request import RequestMetrics, RequestOutput, SeqStatus, Sequence
from pdmesh.sampling_params import SamplingParams
from pdmesh.structured.grammars import Grammars
from pdmesh.tokenizer import Tokenizer


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.probe_threads or config.num_threads:
            torch.set_num_threads(config.probe_threads or config.num_threads or 1)
        self.allocator = keep_freed_memory() if config.device == "cpu" else None
        self.tokenizer = Tokenizer(config.model)
        model_cfg = ModelConfig.from_dir(config.model)
        self.max_model_len = model_cfg.context_limit(config.max_model_len)
        check_memory_before_loading(config, model_cfg)
        model, cfg, dtype = load_model(config.model, config.dtype, config.device, self.max_model_len)
        self.model_config = cfg
        self.dtype = dtype
        cc = config.cache
        self.hasher = BlockHasher(cc.block_size, cc.hash_seed, cc.hash_algorithm)
        layout = KVLayout.for_model(cfg, cc.block_size, str(dtype).removeprefix("torch."))
        num_blocks = pool_blocks(cc, config.scheduler, cfg, layout.block_bytes, dtype.itemsize,
                                 cc.gpu_memory_utilization, device_memory(config.device))
        self.pool = BlockPool(num_blocks, cc.enable_prefix_caching, cc.prefix_eviction)
        self.kv = KVCacheManager(self.pool, self.hasher)
        self.scheduler = Scheduler(config.scheduler, self.kv)
        graphs = CudaGraphSizes(config.scheduler.max_num_seqs, self.max_model_len) if config.cuda_graphs else None
        self.runner = ModelRunner(
            model, cfg, dtype, num_blocks, cc.block_size, self.kv,
            build_backend(config.attention_backend, config.device, dtype, cfg.head_dim, cfg.attention_variants),
            config.device, graphs,
        )  # measures the linear plan (``use_linear_plan``) or captures the CUDA graphs
        if config.probe_threads and config.num_threads:
            torch.set_num_threads(config.num_threads)  # probed: back to the engine's own
        self.admission = Admission(self.tokenizer, cfg.vocab_size, self.max_model_len,
                                   num_blocks, cc.block_size)
        eos = cfg.end_ids(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.grammars = Grammars(self.tokenizer.json_text(), cfg.vocab_size, eos)
        self.sampler = Sampler(tuple(eos), self.grammars)
        self.speculator = build_speculator(config, cfg.vocab_size, num_blocks, self.max_model_len)
        self._requests: dict[str, RequestState] = {}
        self._to_render: dict[str, RequestState] = {}
        """Requests with output to emit that no model step produced (aborts, commits)."""
        self.handoff = KVHandoff(self)
        self.lock = threading.RLock()
        """Guards scheduler, pool and request state; not held during the forward pass."""
        self.prefill_cost = TokenCost()
        """Measured seconds per prompt token (advertised to routers)."""
        self.step_log = StepLog.from_env()
        self.tokens = TokenCommit(self._requests, self.scheduler, self.kv, self.eos_token_ids, self.max_model_len)

    @classmethod
    def from_model(cls, model: str, **kwargs: Any) -> LLMEngine:
        """``kwargs`` are ``EngineArgs`` fields (dtype, num_blocks, threads ...)."""
        return cls(EngineArgs(model=model, **kwargs).engine_config())

    # -- requests ---------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | Mapping[str, Any] | None = None,
        arrival_time: float | None = None,
        hold_kv: bool = False,
        resume: Resume | None = None,
    ) -> None:
        """Queue a request; raises ``InvalidRequestError`` naming the offending field.

        ``hold_kv`` keeps the request's blocks when it finishes, until
        ``handoff.release`` (a prefill worker writing them to a decode worker). ``resume``
        continues a request another worker started (see ``Resume``).
        """
        state = self.admit(request_id, prompt, params, arrival_time)
        state.hold_kv = hold_kv
        if resume is not None:
            try:
                resume.apply(state, self.model_config.vocab_size, self.config.device)
            except InvalidRequestError:
                self.forget(request_id)
                raise
        self.scheduler.add(state.seqs[0])

    def admit(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | Mapping[str, Any] | None,
        arrival_time: float | None = None,
    ) -> RequestState:
        """Validate and register a request; its first sequence is not scheduled yet (the
        caller adds it to the scheduler, or reserves its blocks for remote KV)."""
        if not isinstance(params, SamplingParams):
            params = SamplingParams.from_dict(params or {})
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id", "must be a non-empty string")
        if request_id in self._requests:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in flight")
        text, token_ids = self.admission.prompt_ids(prompt)
        self.admission.check_fits(token_ids, params)
        if params.structured_output is not None:  # a cache hit where AsyncLLMEngine.prepare ran
            self.grammars.compile(params.structured_output)
        now = arrival_time if arrival_time is not None else time.monotonic()
        state = RequestState(request_id, text, token_ids, params, RequestMetrics(now))
        first = state.new_sequence(self.tokenizer, self.config.device, list(token_ids))
        first.fork_pending = params.n > 1
        self._requests[request_id] = state
        return state

    def abort_request(self, request_id: str) -> None:
        """End a request in any state and free its blocks; its final output says "abort"."""
        if self.handoff.release(request_id):
            return
        state = self._requests.pop(request_id, None)
        if state is None:
            raise UnknownRequestError(request_id)
        for seq in state.seqs:
            if not seq.status.finished:
                self.scheduler.finish(seq, SeqStatus.FINISHED_ABORTED)
        # Siblings that were never forked end as aborted too.
        while len(state.seqs) < state.params.n:
            state.new_sequence(self.tokenizer, self.config.device, list(state.prompt_token_ids)).set_finished(
                SeqStatus.FINISHED_ABORTED
            )
        state.metrics.finished_time = time.monotonic()
        self._to_render[request_id] = state

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._to_render)

    def handoff_seqs(self) -> list[Sequence]:
        """Sequences whose blocks a hand-off owns (reserved for remote KV, or held)."""
        return [s for st in self._requests.values() for s in st.seqs if s.status.in_handoff]

    def orphan_blocks(self) -> int:
        """Blocks in use that no live request owns; anything but 0 is a leak."""
        live = set(self.scheduler.live_seq_ids()) | {s.seq_id for s in self.handoff_seqs()}
        owned = self.kv.block_ids_of_sequences(live)
        return self.pool.stats().used - len(owned)

    # -- what the hand-off (engine/handoff.py) builds on -------------------------------
    def first_seq(self, request_id: str) -> Sequence:
        """The first sequence of a live request."""
        state = self._requests.get(request_id)
        if state is None or not state.seqs:
            raise UnknownRequestError(request_id)
        return state.seqs[0]

    def forget(self, request_id: str) -> None:
        """Drop a request whose blocks are already freed (a released hand-off)."""
        self._requests.pop(request_id, None)

    def start_running(self, seq: Sequence, first_token: int, logprob: Any) -> None:
        """A sequence whose prompt KV arrived from elsewhere: admit it as running with its
        first token appended, and emit that token without waiting for a model step."""
        state = self._requests[seq.request_id]
        self.scheduler.add_running(seq)
        state.metrics.first_scheduled_time = time.monotonic()
        self.tokens.append(seq, first_token, logprob)
        self._to_render[seq.request_id] = state

    @property
    def generated_tokens(self) -> int:
        """Tokens sampled and kept since start (the workers' periodic stats line)."""
        return self.tokens.generated_tokens

    def stats(self) -> BlockPoolStats:
        return self.pool.stats()

    # -- the step ---------------------------------------------------------------------
    def step(self, prompt_budget: int | None = None) -> list[RequestOutput]:
        """One engine iteration. Holds ``lock`` except while the model runs, so hand-off
        bookkeeping (reserve, commit, release, Info) from other threads never waits for a
        forward pass; aborts still happen between steps (they free blocks being written).
        ``prompt_budget``: at most this many prompt tokens in the step (``Scheduler.schedule``)."""
        with self.lock:
            if self.speculator is not None:
                self.speculator.propose(self.scheduler.running, self.sampler)
            sched = self.scheduler.schedule(prompt_budget)
            prepared = self.runner.prepare(sched) if sched else None
        usage = ThreadUsage.now() if self.step_log is not None else None
        started = time.perf_counter()
        result = self.runner.forward(prepared) if prepared is not None else None
        if result is not None:
            seconds, prompt = time.perf_counter() - started, sched.num_prompt_tokens
            self.prefill_cost.observe_step(prompt, sched.num_batched_tokens, seconds)
            if self.step_log is not None and usage is not None:
                self.step_log.record(sched, prompt, seconds, usage, self.scheduler.num_waiting)
        with self.lock:
            return self._finish_step(sched, result)

    def block_ids_of(self, request_id: str) -> list[int]:
        """Blocks of a live request's first sequence, in order."""
        return self.kv.block_ids(self.first_seq(request_id))

    def take_ready_outputs(self) -> list[RequestOutput]:
        """Outputs that need no model step (commits, aborts), without running one."""
        with self.lock:
            return self._finish_step(None, None)

    def _finish_step(self, sched: SchedulerOutput | None, result: StepResult | None) -> list[RequestOutput]:
        touched, self._to_render = self._to_render, {}
        if sched and result is not None:
            now = time.monotonic()
            for item in sched.scheduled:
                if item.spec:  # only the committed token's KV counts until drafts are verified
                    item.seq.num_computed_tokens = item.start + 1
                self.kv.cache_blocks(item.seq)
                state = self._requests[item.seq.request_id]
                if state.metrics.first_scheduled_time is None:
                    state.metrics.first_scheduled_time = now
            if result.prompt_rows:
                record_prompt_logprobs(result)
            rows, seqs, drafts = expand_forks(result, lambda seq: fork_siblings(
                self._requests[seq.request_id], seq, self.tokenizer, self.config.device, self.kv, self.scheduler))
            logits = result.logits[rows.to(result.logits.device)] if rows is not None else result.logits
            for seq, verified in zip(seqs, self._sample(logits, seqs, drafts)):
                self.tokens.commit(seq, verified)
                touched[seq.request_id] = self._requests[seq.request_id]
        if self.speculator is not None:  # drop draft state of sequences that ended or aborted
            self.speculator.retain(set(self.scheduler.live_seq_ids()))
        outputs = []
        for state in touched.values():
            if state.finished and not state.hold_kv:
                self._requests.pop(state.request_id, None)
            out = state.render()
            if out is not None:
                outputs.append(out)
        return outputs

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]) -> list[Verified]:
        if self.speculator is not None and any(drafts):
            return self.speculator.verify(self.sampler, logits, seqs, drafts)
        sampled = self.sampler(logits, seqs)
        return [Verified([t], [lp]) for t, lp in zip(sampled.token_ids, sampled.logprobs)]
