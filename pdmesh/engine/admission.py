"""Checks a request must pass before the engine tracks it; each error names the field.

Kept apart from the step loop: it needs only the tokenizer, the model's limits and the
pool's size, and its messages are part of the user-facing contract (they say what to
change).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmesh.errors import InvalidRequestError
from pdmesh.sampling_params import SamplingParams
from pdmesh.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Admission:
    tokenizer: Tokenizer
    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int

    def prompt_ids(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)`` of a text or token-id prompt."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "must not be empty")
            return prompt, self.tokenizer.encode(prompt)
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("prompt", "must contain at least one token id")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise InvalidRequestError(
                    "prompt", f"token id {t!r} is outside the vocabulary [0, {self.vocab_size})"
                )
        return None, ids

    def check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        """The prompt plus ``max_tokens`` fits the model's context and the KV pool."""
        n, limit = len(token_ids), self.max_model_len
        if n >= limit:
            raise InvalidRequestError(
                "prompt",
                f"{n} tokens; the model's context is {limit}, so a prompt may have at most {limit - 1}",
            )
        if n + params.max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens",
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"context of {limit}; lower max_tokens to at most {limit - n}",
            )
        blocks = -(-(n + params.max_tokens) // self.block_size)
        capacity = self.num_blocks * self.block_size
        if blocks > self.num_blocks:
            if n >= capacity:
                raise InvalidRequestError(
                    "prompt",
                    f"{n} tokens do not fit the KV pool ({self.num_blocks} blocks of "
                    f"{self.block_size} tokens = {capacity}); shorten the prompt",
                )
            raise InvalidRequestError(
                "max_tokens",
                f"prompt + max_tokens needs {blocks} KV blocks but the pool holds "
                f"{self.num_blocks}; lower max_tokens to at most {capacity - n}",
            )
        for t in params.stop_token_ids:
            if t >= self.vocab_size:
                raise InvalidRequestError(
                    "stop_token_ids", f"{t} is outside the vocabulary [0, {self.vocab_size})"
                )
