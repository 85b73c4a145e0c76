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
    prompt_logprobs: list[Any] = field(default_factory=list)
    """``TokenLogprob`` messages of prompt tokens 1.. (``prompt_logprobs``)."""
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def add(self, resp: Any) -> None:
        self.text.append(resp.text)
        self.token_ids.extend(resp.token_ids)
        self.logprobs.extend(resp.logprobs)
        self.prompt_logprobs.extend(resp.prompt_logprobs)
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


def prompt_logprobs_json(tok: Tokenizer, lps: list[Any]) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token a dict
    from token id to its logprob, rank and text: the prompt's own token and the top-N."""
    def one(lp: Any) -> dict[str, Any]:
        out = {str(t.token_id): {"logprob": t.logprob, "decoded_token": token_str(tok, t.token_id)} for t in lp.top}
        for rank, key in enumerate(out, 1):
            out[key]["rank"] = rank
        out[str(lp.token_id)] = {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": token_str(tok, lp.token_id)}
        return out

    return [None, *map(one, lps)]


def echoed_logprobs(tok: Tokenizer, prompt_ids: list[int], prompt_lps: list[Any], lps: list[Any]) -> dict[str, Any]:
    """``echo`` with ``logprobs``: the completions shape over the prompt's tokens (the
    first without a logprob, as OpenAI's) and then the generated ones."""
    first = token_str(tok, prompt_ids[0])
    head = completion_logprobs(tok, prompt_lps, len(first))
    tail = completion_logprobs(tok, lps, len(first) + sum(map(len, head["tokens"])))
    return {"tokens": [first, *head["tokens"], *tail["tokens"]],
            "token_logprobs": [None, *head["token_logprobs"], *tail["token_logprobs"]],
            "top_logprobs": [None, *head["top_logprobs"], *tail["top_logprobs"]],
            "text_offset": [0, *head["text_offset"], *tail["text_offset"]]}


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
