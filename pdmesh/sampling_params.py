"""How one request wants its tokens chosen and when it stops.

``SamplingParams`` validates itself on construction: a bad value raises
``InvalidRequestError`` naming the field and the allowed range, so no invalid request
reaches the scheduler.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdmesh.config import MAX_SPECULATIVE_TOKENS
from pdmesh.errors import InvalidRequestError
from pdmesh.structured.spec import StructuredOutput

OutputKind = Literal["cumulative", "delta", "final_only"]
_MAX_LOGPROBS = 20
_MAX_N = 64
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 512
MAX_STOP_TOKEN_IDS = 1024
MAX_CACHE_SALT_CHARS = 512
"""Bounds on what one request may ask for, so no request makes a worker do unbounded work."""
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1
"""The widest values the wire's fields hold (``common.proto``: ``top_k`` int32, token ids
and ``max_tokens`` uint32): a larger one is refused here, not by protobuf mid-request."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping options (defaults match vLLM's and HF's)."""

    n: int = 1
    """Completions per prompt; they share the prompt's KV blocks (copy-on-write)."""
    temperature: float = 1.0
    """0 means greedy; otherwise logits are divided by it before sampling."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 (or -1) keeps all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below ``min_p`` times the top token's."""
    presence_penalty: float = 0.0
    """Subtracted once from every token already generated, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted per occurrence of each generated token, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """HF-style multiplicative penalty on prompt and generated tokens, > 0."""
    seed: int | None = None
    """Makes sampling reproducible whatever else shares the batch."""
    max_tokens: int = 16
    """Most tokens to generate (>= 1)."""
    min_tokens: int = 0
    """Stop tokens (EOS, ``stop_token_ids``) are suppressed until this many are generated."""
    stop: tuple[str, ...] = ()
    """Strings that end generation; excluded from the text unless asked."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end generation (in addition to EOS)."""
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    """Keep generating past the model's EOS token."""
    logprobs: int | None = None
    """Return the sampled token's logprob and the top-N (0 = sampled token only)."""
    prompt_logprobs: int | None = None
    """Return each prompt token's logprob (after the first) and the top-N at its position,
    computed by the worker that prefills; its prompt is recomputed, not read from the
    prefix cache (cached blocks hold KV, not the logits)."""
    skip_special_tokens: bool = True
    output_kind: OutputKind = "cumulative"
    """What each streamed output holds: everything so far, only what is new, or only the end."""
    cache_salt: str | None = None
    """Separates prefix-cache entries between tenants."""
    priority: int = 0
    """Lower runs first; preemption picks the lowest priority, newest admitted request."""
    num_speculative_tokens: int | None = None
    """Speculative decoding: drafts per step for this request, capped by the engine's
    ``num_speculative_tokens``; 0 turns it off for this request; None uses the engine's."""
    structured_output: StructuredOutput | None = None
    """What the output must match (a JSON schema, JSON, a regex, a choice, a grammar): tokens
    it forbids are never sampled (``pdmesh/structured``)."""

    def __post_init__(self) -> None:
        # Frozen: normalise sequences through object.__setattr__.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if isinstance(self.structured_output, Mapping):
            object.__setattr__(self, "structured_output", StructuredOutput.from_dict(self.structured_output))
        self._validate()

    def _validate(self) -> None:
        _int_range("n", self.n, 1, _MAX_N)
        _finite("temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature}")
        _finite("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        _int_range("top_k", self.top_k, 0, _INT32_MAX, "0 or -1 disables it")
        _finite("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _finite(name, value)
            if not -2 <= value <= 2:
                raise InvalidRequestError(name, f"must be in [-2, 2], got {value}")
        _finite("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise InvalidRequestError(
                "repetition_penalty", f"must be > 0, got {self.repetition_penalty}"
            )
        if self.seed is not None:
            _int_range("seed", self.seed, -(2**63), 2**63 - 1)
        _int_range("max_tokens", self.max_tokens, 1, _UINT32_MAX)
        _int_range("min_tokens", self.min_tokens, 0, self.max_tokens, "and <= max_tokens")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError("stop", f"every stop string must be non-empty, got {s!r}")
            if len(s) > MAX_STOP_CHARS:
                raise InvalidRequestError("stop", f"a stop string may have at most {MAX_STOP_CHARS} "
                                          f"characters, got {len(s)}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids, "
                                      f"got {len(self.stop_token_ids)}")
        for t in self.stop_token_ids:
            _int_range("stop_token_ids", t, 0, _UINT32_MAX)
        if self.cache_salt is not None and len(self.cache_salt) > MAX_CACHE_SALT_CHARS:
            raise InvalidRequestError("cache_salt", f"at most {MAX_CACHE_SALT_CHARS} characters, "
                                      f"got {len(self.cache_salt)}")
        if self.logprobs is not None:
            _int_range("logprobs", self.logprobs, 0, _MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _int_range("prompt_logprobs", self.prompt_logprobs, 0, _MAX_LOGPROBS)
        if self.output_kind not in ("cumulative", "delta", "final_only"):
            raise InvalidRequestError(
                "output_kind",
                f"must be 'cumulative', 'delta' or 'final_only', got {self.output_kind!r}",
            )
        _int_range("priority", self.priority, -(2**31), 2**31 - 1)
        if self.num_speculative_tokens is not None:
            _int_range("num_speculative_tokens", self.num_speculative_tokens, 0, MAX_SPECULATIVE_TOKENS)
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            raise InvalidRequestError("structured_output", "must be a StructuredOutput")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @functools.cached_property
    def max_stop_len(self) -> int:
        """Read when every output is rendered, every step: computed once (the fields are frozen)."""
        return max((len(s) for s in self.stop), default=0)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> SamplingParams:
        """Build from user-supplied options, rejecting unknown names precisely."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidRequestError(
                unknown[0], f"unknown sampling option; known options are {sorted(known)}"
            )
        return cls(**options)

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(name, f"must be a finite number, got {value!r}")


def _int_range(
    name: str, value: int, lo: int | None, hi: int | None, note: str = ""
) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(name, f"must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        extra = f" ({note})" if note else ""
        raise InvalidRequestError(name, f"must be in {bounds}{extra}, got {value}")


