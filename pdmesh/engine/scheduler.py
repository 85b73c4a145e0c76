"""Which sequences run this step, and how many of their tokens.

Lifecycle (the queues below are exactly these):
  waiting  — ordered by (priority, arrival); preempted sequences rejoin here with their
             original place, so they resume before newer work.
  running  — admitted sequences; each step every one gets either the next prefill chunk
             or one decode token, under ``max_num_batched_tokens``.
A sequence leaves running when it finishes, is aborted, or is preempted (its blocks are
freed and its KV recomputed later). When blocks run out, the victim is the lowest-priority
running sequence, newest admitted first.

Token accounting follows vLLM v1: each sequence has ``num_computed_tokens``; scheduling
``k`` tokens advances it by ``k`` at once, and the step that covers the last known token
samples a new one.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from pdmesh.config import SchedulerConfig
from pdmesh.errors import UnknownRequestError
from pdmesh.kv.kv_cache_manager import BlockCopy, KVCacheManager
from pdmesh.request import SeqStatus, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    start: int
    """``num_computed_tokens`` before this step: the position of the first new token."""
    spec: list[int] = field(default_factory=list)
    """Draft tokens verified this step; they follow the last committed token and are part
    of ``num_new_tokens``. Their KV is kept only for the drafts the target accepts."""

    @property
    def samples(self) -> bool:
        """Whether this step produces the sequence's next token."""
        return self.start + self.num_new_tokens - len(self.spec) == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """What the model runner executes this step."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    copies: list[BlockCopy] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of prompt chunks: rows of more than one new token that are not drafts."""
        return sum(s.num_new_tokens for s in self.scheduled if s.num_new_tokens > 1 and not s.spec)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    """Continuous batching with chunked prefill, prefix-aware admission and preemption."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self._waiting: list[tuple[int, float, int, Sequence]] = []
        self._tiebreak = itertools.count()
        self._admissions = itertools.count()
        self.running: list[Sequence] = []
        self._live: dict[str, Sequence] = {}
        self.num_preemptions = 0
        self._probed: dict[str, int] = {}
        """Prompt tokens each waiting sequence was found to have cached (for Info)."""

    # -- queues -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.seq_id in self._live:
            raise ValueError(f"sequence {seq.seq_id!r} is already scheduled")
        self._live[seq.seq_id] = seq
        self._push_waiting(seq)

    def add_running(self, seq: Sequence) -> None:
        """Admit a forked sibling directly: it already holds its parent's blocks."""
        self._live[seq.seq_id] = seq
        seq.status = SeqStatus.RUNNING
        seq.admit_order = next(self._admissions)
        self.running.append(seq)

    def _push_waiting(self, seq: Sequence) -> None:
        heapq.heappush(
            self._waiting, (seq.priority, seq.arrival_time, next(self._tiebreak), seq)
        )

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def pending_prompt_tokens(self) -> int:
        """Prompt tokens admitted and still to compute (waiting, preempted or mid-prefill),
        less what a waiting sequence will find in the prefix cache: a queue of prompts that
        hit is short work, and reporting their whole length would send the next prompt
        sharing that prefix away from the worker that holds it. A decoding sequence's one
        new token is not prompt work."""
        total = 0
        probed: dict[str, int] = {}
        for seq in self._live.values():
            todo = seq.num_tokens - seq.num_computed_tokens
            if todo <= 1:
                continue
            if seq.num_computed_tokens == 0:
                # Probed once per waiting sequence (a long queue must not hold the engine
                # lock for every Info call); the cache may change meanwhile: an estimate.
                hit = self._probed.get(seq.seq_id)
                if hit is None:
                    hit = len(self.kv.get_computed_blocks(seq)) * self.kv.block_size
                probed[seq.seq_id] = hit
                todo -= hit
            total += todo
        self._probed = probed
        return total

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def live_seq_ids(self) -> list[str]:
        """Sequences waiting, running or preempted (each owns its blocks)."""
        return list(self._live)

    def finish(self, seq: Sequence, status: SeqStatus, free: bool = True) -> None:
        """End ``seq`` (stop, length or abort) and free its blocks, whatever its state.

        ``free=False`` leaves the blocks to the caller (KV held for a transfer).
        """
        if seq.seq_id not in self._live:
            raise UnknownRequestError(seq.seq_id)
        del self._live[seq.seq_id]
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status in (SeqStatus.WAITING, SeqStatus.PREEMPTED):
            self._waiting = [e for e in self._waiting if e[3] is not seq]
            heapq.heapify(self._waiting)
        seq.set_finished(status)
        if free:
            self.kv.free(seq)

    # -- the step ---------------------------------------------------------------------
    def schedule(self, prompt_budget: int | None = None) -> SchedulerOutput:
        """The next step's batch. ``prompt_budget`` caps this step's prompt tokens below
        ``max_num_batched_tokens`` (decode tokens are not capped by it): a worker running a
        step on part of the machine's cores keeps the step as short as a full one."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        chunk = self.config.long_prefill_token_threshold or budget
        prompt_left = budget if prompt_budget is None else min(budget, prompt_budget)
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted earlier in this loop
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining > 1 and prompt_left <= 0:
                continue  # a prompt chunk, and this step's prompt tokens are spent
            num_new = min(remaining, budget, chunk, prompt_left if remaining > 1 else 1)
            spec = self._drafts_that_fit(seq, num_new, budget)
            while not self.kv.allocate_slots(seq, num_new + len(spec)):
                if spec:
                    spec = []  # drafts are optional: drop them before preempting anyone
                    continue
                victim = self._pick_victim()
                self._preempt(victim, out)
                budget += self._unschedule(victim, out)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                continue
            num_new += len(spec)
            out.scheduled.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens, spec))
            seq.num_computed_tokens += num_new
            budget -= num_new
            if remaining > 1:
                prompt_left -= num_new
        if not out.preempted:
            self._admit(out, min(budget, prompt_left), chunk)
        out.copies = self.kv.take_copies()
        return out

    @staticmethod
    def _drafts_that_fit(seq: Sequence, num_new: int, budget: int) -> list[int]:
        """The proposed drafts this step verifies: only after the last committed token
        (a decode step) and only as many as the token budget leaves room for."""
        drafts, seq.spec_token_ids = seq.spec_token_ids, []
        if not drafts or num_new != 1 or seq.num_tokens - seq.num_computed_tokens != 1:
            return []
        return drafts[: max(0, budget - 1)]

    def _admit(self, out: SchedulerOutput, budget: int, chunk: int) -> None:
        # Prefix-aware: a waiting sequence whose next uncached block is being computed
        # right now by a running one waits a step, then hits the cache instead of
        # computing the same prefix twice.
        in_flight = self.kv.uncached_hashes(self.running) if self._waiting else set()
        deferred: list[tuple[int, float, int, Sequence]] = []
        while self._waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._waiting[0][3]
            hits = self.kv.get_computed_blocks(seq) if seq.num_computed_tokens == 0 else []
            if len(hits) < len(seq.block_hashes) and seq.block_hashes[len(hits)] in in_flight:
                deferred.append(heapq.heappop(self._waiting))
                continue
            num_hit = len(hits) * self.kv.block_size
            num_new = min(seq.num_tokens - seq.num_computed_tokens - num_hit, budget, chunk)
            if not self.kv.allocate_slots(seq, num_new, hits):
                break
            heapq.heappop(self._waiting)
            if seq.status is SeqStatus.WAITING and seq.num_output_tokens == 0:
                seq.num_cached_tokens = num_hit
            seq.status = SeqStatus.RUNNING
            seq.admit_order = next(self._admissions)
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens))
            seq.num_computed_tokens += num_new
            budget -= num_new
            in_flight.update(seq.block_hashes[len(hits) :])
        for entry in deferred:
            heapq.heappush(self._waiting, entry)

    def _pick_victim(self) -> Sequence:
        # Largest priority value = least important; among equals the newest admission.
        return max(self.running, key=lambda s: (s.priority, s.admit_order))

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.status = SeqStatus.PREEMPTED
        self._push_waiting(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    @staticmethod
    def _unschedule(seq: Sequence, out: SchedulerOutput) -> int:
        """Drop ``seq`` from this step's batch if it was already in it; returns freed budget."""
        for i, item in enumerate(out.scheduled):
            if item.seq is seq:
                del out.scheduled[i]
                return item.num_new_tokens
        return 0
