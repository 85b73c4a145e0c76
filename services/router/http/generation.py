"""One OpenAI request through the mesh: its prompts x ``n`` completions as choices, whole or
streamed as SSE.

Choice ``p * n + i`` is completion ``i`` of prompt ``p`` (as vLLM numbers them). Every
prompt is its own ``Router.generate`` (registered for abort under ``{id}-{p}``);
a client that disconnects cancels the stream, which cancels every flow and frees the KV
on every worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pdmesh.rpc.convert import FINISH_NAMES
from pdmesh.sampling_params import SamplingParams
from services.router.http import render
from services.router.http.answer import ChatAnswer
from services.router.http.errors import error_body, status_of
from services.router.reasoning import ReasoningParser, ReasoningSplit
from services.router.request.streams import merge
from services.router.router import Router
from services.router.tools.calls import CallStream, ToolPlan

Kind = Literal["completion", "chat"]


@dataclass
class Generation:
    router: Router
    kind: Kind
    request_id: str
    model: str
    prompts: list[tuple[str | None, list[int]]]
    """``(text, ids)`` per prompt; the text is echoed back when asked."""
    params: SamplingParams
    echo: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    show_prompt_logprobs: bool = False
    """The body asked for ``prompt_logprobs`` (vLLM's field), not only ``echo`` with ``logprobs``."""
    tools: ToolPlan | None = None
    """A chat's tools: each choice's answer is read into content and tool calls."""
    reasoning: ReasoningParser | None = None
    """A chat's reasoning parser: each choice's thinking goes to ``reasoning_content``."""
    created: int = field(default_factory=lambda: int(time.time()))
    usage: render.Usage = field(default_factory=render.Usage)
    _answers: dict[int, ChatAnswer] = field(default_factory=dict)

    def _answer(self, index: int) -> ChatAnswer | None:
        if self.tools is None and self.reasoning is None:
            return None
        if index not in self._answers:
            self._answers[index] = ChatAnswer(ReasoningSplit(self.reasoning) if self.reasoning else None,
                                              CallStream(self.tools) if self.tools else None)
        return self._answers[index]

    def __post_init__(self) -> None:
        self.usage.prompt_tokens = sum(len(ids) for _, ids in self.prompts)

    def stream(self) -> AsyncGenerator[tuple[int, Any], None]:
        """``(choice index, GenerateResponse)`` across every prompt and completion."""
        n = self.params.n
        deadline = asyncio.get_running_loop().time() + self.router.cfg.request_timeout_s
        streams = [
            self.router.generate(self.request_id if len(self.prompts) == 1 else f"{self.request_id}-{p}",
                               ids, self.params, deadline)
            for p, (_, ids) in enumerate(self.prompts)
        ]

        async def tagged() -> AsyncGenerator[tuple[int, Any], None]:
            async for p, (i, resp) in merge(streams):
                yield p * n + i, resp

        return tagged()

    # -- whole response ---------------------------------------------------------------
    async def collect(self, first: tuple[int, Any] | None, rest: AsyncIterator[tuple[int, Any]]
                      ) -> dict[str, Any]:
        choices = {i: render.Choice(i) for i in range(len(self.prompts) * self.params.n)}
        if first is not None:
            self._add(choices, *first)
        async for index, resp in rest:
            self._add(choices, index, resp)
        body = self._head("chat.completion" if self.kind == "chat" else "text_completion")
        body["choices"] = [self._choice_json(c) for c in choices.values()]
        if self.kind == "chat" and self.show_prompt_logprobs:  # vLLM's chat: once, beside the choices
            body["prompt_logprobs"] = render.prompt_logprobs_json(self.router.tokenizer, choices[0].prompt_logprobs)
        body["usage"] = self.usage.json()
        if self.return_token_ids:
            body["prompt_token_ids"] = [ids for _, ids in self.prompts]
        return body

    def _add(self, choices: dict[int, render.Choice], index: int, resp: Any) -> None:
        choices[index].add(resp)
        self.usage.add(resp)

    def _choice_json(self, c: render.Choice) -> dict[str, Any]:
        text = "".join(c.text)
        tok = self.router.tokenizer
        lp = None
        prompt_ids = self.prompts[c.index // self.params.n][1]
        if self.params.logprobs is not None:
            if self.kind == "chat":
                lp = render.chat_logprobs(tok, c.logprobs)
            elif self.echo:
                lp = render.echoed_logprobs(tok, prompt_ids, c.prompt_logprobs, c.logprobs)
            else:
                lp = render.completion_logprobs(tok, c.logprobs, 0)
        out: dict[str, Any] = {"index": c.index, "logprobs": lp, "finish_reason": c.finish_reason,
                               "stop_reason": c.stop_reason}
        if self.kind == "chat":
            out["message"] = {"role": "assistant", "content": text}
            answer = self._answer(c.index)
            if answer is not None:
                piece = answer.read(text, final=True)
                out["message"]["content"] = piece.content or None
                if self.reasoning is not None:
                    out["message"]["reasoning_content"] = piece.reasoning or None
                if answer.made_calls:
                    out["message"]["tool_calls"] = answer.all_calls
                    out["finish_reason"] = _finish_with_calls(c.finish_reason)
        else:
            out["text"] = (self._echo_text(c.index) if self.echo else "") + text
        if self.return_token_ids:
            out["token_ids"] = c.token_ids
        if self.kind == "completion" and self.show_prompt_logprobs:
            out["prompt_logprobs"] = render.prompt_logprobs_json(tok, c.prompt_logprobs)
        return out

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    # -- SSE --------------------------------------------------------------------------
    async def sse(self, first: tuple[int, Any] | None, rest: AsyncIterator[tuple[int, Any]]
                  ) -> AsyncIterator[str]:
        async for chunk in self.chunks(first, rest):
            yield render.sse(chunk)
        yield render.SSE_DONE

    async def chunks(self, first: tuple[int, Any] | None, rest: AsyncIterator[tuple[int, Any]]
                     ) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks as objects: one choice's delta each, then the usage when
        asked; an error after the 200 went out travels as the last one (``{"error": ...}``)."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        started: set[int] = set()
        offsets: dict[int, int] = {}
        if self.kind == "chat":
            # Every choice's role first, in index order, as OpenAI's server sends them: the
            # SDK's stream helper builds its snapshot from them and fails on a choice whose
            # index it has not seen in order.
            for index in range(len(self.prompts) * self.params.n):
                started.add(index)
                for chunk in self._opening(index, None, offsets):
                    yield self._head(obj) | {"choices": [chunk]}
        try:
            items = [first] if first is not None else []
            async for index, resp in _achain(items, rest):
                self.usage.add(resp)
                chunks = []
                if index not in started:
                    started.add(index)
                    chunks.extend(self._opening(index, resp, offsets))
                chunks.append(self._delta(index, resp, offsets))
                for chunk in chunks:
                    yield self._head(obj) | {"choices": [chunk]}
        except Exception as exc:  # noqa: BLE001 - after the 200 went out: the error travels in the stream
            yield error_body(status_of(exc))
        else:
            if self.include_usage:
                yield self._head(obj) | {"choices": [], "usage": self.usage.json()}

    def _echo_text(self, index: int) -> str:
        """The prompt a choice echoes: its text, or a token-id prompt's tokens rendered."""
        text, ids = self.prompts[index // self.params.n]
        return text if text is not None else self.router.tokenizer.decode(ids, skip_special_tokens=False)

    def _opening(self, index: int, first: Any, offsets: dict[int, int]) -> list[dict[str, Any]]:
        """What a choice's first chunk carries before its tokens: the role, or the echo
        (with the prompt's logprobs when ``logprobs`` is set; ``first`` is the choice's
        first response, which carries them)."""
        if self.kind == "chat":
            return [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]
        if not self.echo:
            return []
        text, ids = self._echo_text(index), self.prompts[index // self.params.n][1]
        lp = None
        if self.params.logprobs is not None and first is not None:
            lp = render.echoed_logprobs(self.router.tokenizer, ids, list(first.prompt_logprobs), [])
            offsets[index] = len(text)
        return [{"index": index, "text": text, "logprobs": lp, "finish_reason": None}]

    def _delta(self, index: int, resp: Any, offsets: dict[int, int]) -> dict[str, Any]:
        finish = (FINISH_NAMES.get(resp.finish_reason) or "stop") if resp.finish_reason else None
        tok = self.router.tokenizer
        lp = None
        if self.params.logprobs is not None and resp.logprobs:
            if self.kind == "chat":
                lp = render.chat_logprobs(tok, list(resp.logprobs))
            else:
                lp = render.completion_logprobs(tok, list(resp.logprobs), offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + len(resp.text)
        chunk: dict[str, Any] = {"index": index, "logprobs": lp, "finish_reason": finish}
        if self.show_prompt_logprobs and resp.prompt_logprobs:
            chunk["prompt_logprobs"] = render.prompt_logprobs_json(tok, list(resp.prompt_logprobs))
        if finish:
            chunk["stop_reason"] = resp.stop_reason or None
        if self.kind == "chat":
            chunk["delta"] = {"content": resp.text} if resp.text or not finish else {}
            answer = self._answer(index)
            if answer is not None:
                chunk["delta"] = answer.read(resp.text, final=bool(finish)).delta()
                if finish and answer.made_calls:
                    chunk["finish_reason"] = _finish_with_calls(finish)
        else:
            chunk["text"] = resp.text
        if self.return_token_ids:
            chunk["token_ids"] = list(resp.token_ids)
        return chunk


def _finish_with_calls(reason: str | None) -> str | None:
    """A choice that made calls and stopped by itself ended to call them."""
    return "tool_calls" if reason == "stop" else reason


async def _achain(items: list[tuple[int, Any]], rest: AsyncIterator[tuple[int, Any]]
                  ) -> AsyncIterator[tuple[int, Any]]:
    for item in items:
        yield item
    async for item in rest:
        yield item
