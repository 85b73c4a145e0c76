"""Continue a request another worker started (mid-stream migration after a worker died).

The caller gives the tokens already generated and how many characters of their text the
client has seen. The request is rebuilt as if this engine had produced them: they become
output tokens (so ``max_tokens``, ``min_tokens`` and the penalties count them), the
detokenizer reads them without emitting them, and a seeded request's random stream
consumes one draw per token, exactly as the sampler would have. Its KV is recomputed
(prefix-cache hits permitting); the next token sampled is the one the dead worker would
have produced, so the client sees no gap and no repeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdmesh.engine.sampler import seeded_uniform
from pdmesh.errors import InvalidRequestError
from pdmesh.request import TokenLogprob

if TYPE_CHECKING:
    from pdmesh.engine.output import RequestState


@dataclass(frozen=True, slots=True)
class Resume:
    token_ids: tuple[int, ...]
    """Tokens generated so far (all streamed to the client)."""
    text_chars: int
    """Characters of their text the client has received (the rest was held back)."""

    def apply(self, state: RequestState, vocab_size: int, device: str) -> None:
        p = state.params
        if p.n != 1:
            raise InvalidRequestError("n", "a resumed request has exactly one completion")
        if len(self.token_ids) >= p.max_tokens:
            raise InvalidRequestError("resume_token_ids", f"{len(self.token_ids)} tokens already reach "
                                      f"max_tokens ({p.max_tokens})")
        seq, detok, cursor = state.seqs[0], state.detoks[0], state.cursors[0]
        for t in self.token_ids:
            if not 0 <= t < vocab_size:
                raise InvalidRequestError("resume_token_ids", f"token id {t} is outside [0, {vocab_size})")
            seq.token_ids.append(t)
            detok.add(t, check_stop=False)
            if p.logprobs is not None:  # never emitted (the cursor is past them): placeholders
                seq.logprobs.append(TokenLogprob(t, math.nan, 0, ()))
            if seq.generator is not None and not p.greedy:
                seeded_uniform(seq.generator, device)  # the number its sampling drew
        if self.text_chars > len(detok.text):
            raise InvalidRequestError("resume_text_chars", f"{self.text_chars} exceeds the text of the "
                                      f"resumed tokens ({len(detok.text)} characters)")
        cursor.tokens, cursor.chars = len(self.token_ids), self.text_chars
