"""What one token of work costs now: a prompt token in a prefill step, or one fetched
from the kvstore, measured where the work happens.

The router estimates a prompt's time to first token on each prefill worker from the work
queued there and the tokens it would compute (``services/router/policies/cache_aware.py``);
both are priced with the figure measured here rather than a constant, so a worker on a
faster machine, a bigger model or a busier host advertises what it really costs.

The engine counts only steps that are mostly prompt tokens (a decode row costs far less than a
prompt token, and a step of a handful of tokens is dominated by fixed overhead). An
exponential moving average follows drift without letting one slow step swing it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenCost:
    min_tokens: int = 64
    """Observations of fewer tokens than this are not counted."""
    weight: float = 0.2
    """Of the newest observation in the average."""
    s_per_token: float = 0.0
    """Seconds per token (0 until the first observation)."""
    observed: int = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < self.min_tokens or seconds <= 0:
            return
        sample = seconds / tokens
        self.s_per_token = sample if not self.observed else (
            self.weight * sample + (1 - self.weight) * self.s_per_token)
        self.observed += 1

    def observe_step(self, prompt_tokens: int, batched_tokens: int, seconds: float) -> None:
        """A model step: counted only when at least 90% of its tokens are prompt (decode
        rows cost far less than a prompt token and would make prompts look cheap)."""
        if batched_tokens and prompt_tokens >= 0.9 * batched_tokens:
            self.observe(prompt_tokens, seconds)
