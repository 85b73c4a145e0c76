"""pdmesh responses -> OpenAI completion and chat objects (whole or as SSE chunks)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdmesh.rpc.convert import FINISH_NAMES
from pdmesh.tokenizer import Tokenizer


@dataclass(slots=True)
class Choice:
    """One completion as it accumulates."""

    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    """``TokenLogprob`` messages, one per token."""
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def add(self, resp: Any) -> None:
        self.text.append(resp.text)
        self.token_ids.extend(resp.token_ids)
        self.logprobs.extend(resp.logprobs)
        if resp.finish_reason:
            self.finish_reason = FINISH_NAMES.get(resp.finish_reason) or "stop"
            self.stop_reason = resp.stop_reason or None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    def add(self, resp: Any) -> None:
        if resp.finish_reason:
            self.completion_tokens += resp.usage.completion_tokens
            self.cached_tokens += resp.usage.cached_tokens
            self.spec_draft_tokens += resp.usage.spec_draft_tokens
            self.spec_accepted_tokens += resp.usage.spec_accepted_tokens

    def json(self) -> dict[str, Any]:
        # Speculative decoding's drafts are OpenAI's "predicted outputs" accounting.
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "completion_tokens_details": {
                    "accepted_prediction_tokens": self.spec_accepted_tokens,
                    "rejected_prediction_tokens": self.spec_draft_tokens - self.spec_accepted_tokens}}


def token_str(tok: Tokenizer, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False)


def completion_logprobs(tok: Tokenizer, lps: list[Any], offset: int) -> dict[str, Any]:
    """The completions API's shape: parallel lists and a dict of top alternatives per token."""
    tokens = [token_str(tok, lp.token_id) for lp in lps]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{token_str(tok, t.token_id): t.logprob for t in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def chat_logprobs(tok: Tokenizer, lps: list[Any]) -> dict[str, Any]:
    """The chat API's shape: one entry per token with its bytes and its top alternatives."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        s = token_str(tok, token_id)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode())}

    return {"content": [entry(lp.token_id, lp.logprob) | {"top_logprobs": [entry(t.token_id, t.logprob)
                                                                          for t in lp.top]}
                        for lp in lps]}


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"
