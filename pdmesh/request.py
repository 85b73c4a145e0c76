"""Request state: a request is a group of sequences, one per completion (``n``).

Lifecycle of a sequence: WAITING → RUNNING (prefill chunks, then one token per step)
→ FINISHED_*; a RUNNING sequence may be PREEMPTED back to the waiting queue (its KV is
dropped and recomputed), and any state may end in FINISHED_ABORTED. With ``n > 1`` only
the first sequence prefills; when it samples its first token the others fork from it,
sharing the prompt's blocks.

Disaggregation adds two states, so a hand-off is request state, not a side table:
- decode side: WAITING_FOR_REMOTE_KV → RUNNING. The prompt's blocks are reserved while a
  prefill worker writes its KV into them; the scheduler does not see the sequence until
  the first token is committed.
- prefill side: RUNNING → FINISHED_KV_HELD. The sequence is done (its finish reason is
  kept) but its blocks stay allocated until the KV has been written out and released.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

from pdmesh.kv.block_hash import BlockHash
from pdmesh.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_KV_HELD = "finished_kv_held"

    @property
    def finished(self) -> bool:
        """Read for every sequence several times a step: a flag set once per member
        (``self.value`` goes through the enum's descriptor, ~0.35 us a read)."""
        return self._is_finished  # type: ignore[attr-defined]

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)

    @property
    def in_handoff(self) -> bool:
        """Blocks owned outside the scheduler: reserved for remote KV, or held for a write."""
        return self in (SeqStatus.WAITING_FOR_REMOTE_KV, SeqStatus.FINISHED_KV_HELD)


for _status in SeqStatus:
    _status._is_finished = _status.value.startswith("finished")  # type: ignore[attr-defined]

_FINISH_REASONS: dict[SeqStatus, FinishReason] = {
    SeqStatus.FINISHED_STOPPED: "stop",
    SeqStatus.FINISHED_LENGTH: "length",
    SeqStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """Logprobs at one generated position (log-softmax of the raw model logits)."""

    token_id: int
    logprob: float
    rank: int
    """1 = the most likely token."""
    top: tuple[tuple[int, float], ...]
    """The top-N (token id, logprob) pairs, most likely first."""


@dataclass(slots=True, eq=False)
class Sequence:
    """One completion being generated; the scheduler's unit of work."""

    seq_id: str
    request_id: str
    index: int
    """Position of this completion in the request's outputs."""
    params: SamplingParams
    prompt_len: int
    token_ids: list[int]
    """Prompt followed by generated tokens."""
    arrival_time: float
    extra_keys: tuple[str, ...] = ()
    """Folded into this sequence's block hashes (cache salt)."""
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    """Tokens whose KV is in this sequence's blocks."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at (first) admission."""
    block_hashes: list[BlockHash] = field(default_factory=list)
    """Hashes of this sequence's full blocks, filled lazily by the KV manager."""
    admit_order: int = -1
    """Set on each admission; preemption takes the newest."""
    generator: Any = None
    """A torch.Generator when the request is seeded."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the sequence."""
    fork_pending: bool = False
    """True for the first sequence of an n > 1 request until it forks its siblings."""
    finish_reason: FinishReason | None = None
    """Why it finished; kept when the status moves on to FINISHED_KV_HELD."""
    spec_token_ids: list[int] = field(default_factory=list)
    """Draft tokens proposed for the next step (speculative decoding); never committed
    until the target model verifies them."""
    spec_draft_probs: Any = None
    """The draft model's distributions [k, vocab] for sampled requests (None: the drafts
    are deterministic, as n-gram lookup and greedy drafts are)."""
    token_tensor: Any = None
    """``(token_ids, the same as a tensor, its last token)``, the tensor extended as
    tokens are appended (``token_tensor`` in ``pdmesh/engine/sampler.py``: penalties read
    every token each step)."""
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    """With ``prompt_logprobs``: the logprob of prompt token ``i + 1`` at entry ``i``, filled
    as the prompt's chunks are computed (the first sequence of a request only)."""
    grammar: Any = None
    """Its place in its structured output's grammar (``TokenGrammar``), made when it first
    samples under one."""

    def set_finished(self, status: SeqStatus) -> None:
        self.status = status
        self.finish_reason = status.finish_reason

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def priority(self) -> int:
        return self.params.priority

    @property
    def is_prefill(self) -> bool:
        return self.num_tokens - self.num_computed_tokens > 1


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps (``time.monotonic()``) and cache use of one request."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache instead of computed."""
    spec_draft_tokens: int = 0
    """Speculative decoding: draft tokens the target verified."""
    spec_accepted_tokens: int = 0
    """Of those, how many were accepted."""
    spec_steps: int = 0
    """Verification steps (each emits the accepted drafts plus one token of the target's)."""

    @property
    def spec_acceptance_rate(self) -> float | None:
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else None

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens emitted per verification step, the target's own token included (vLLM's
        "mean acceptance length"): 1.0 means no draft was ever accepted."""
        return 1 + self.spec_accepted_tokens / self.spec_steps if self.spec_steps else None

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(slots=True)
class CompletionOutput:
    """One completion of a request, as a user sees it."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """What ``LLMEngine.step`` and ``LLM.generate`` return per request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: list[TokenLogprob] | None = None
    """With ``prompt_logprobs``: prompt tokens 1.. (the first has none), on the first output
    that has them all (every output for the cumulative and final kinds)."""
