"""``POST /v1/responses``: OpenAI's Responses API as a shape of the chat path.

A request becomes a chat request (``as_chat``: instructions as the system message, input
items as messages, function-call items and their outputs as assistant tool calls and tool
messages, ``text.format`` as ``response_format``, flat function tools as chat tools), runs
through the same generation, and its chat body or chunks are rewritten as a Response
object (``Reply.body``) or the Responses stream events (``Reply.events``). There is no
second code path to generate, constrain or read tool calls.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pdmesh.errors import InvalidRequestError
from services.router.http import render
from services.router.http.generation import Generation
from services.router.http.schemas import ChatCompletionRequest, ResponsesRequest


def as_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    messages: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _text(item.get("content"), i)})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _text(item.get("output"), i)})
        else:
            raise InvalidRequestError(f"input[{i}].type", f"{kind!r} is not supported (message, function_call, "
                                      "function_call_output)")
    body: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
                            "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
                            "parallel_tool_calls": req.parallel_tool_calls,
                            "tool_choice": _tool_choice(req.tool_choice)}
    if req.tools:
        body["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
    fmt = (req.text or {}).get("format")
    if fmt and fmt.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
    elif fmt:
        body["response_format"] = {"type": fmt.get("type")}
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                raise InvalidRequestError(f"input[{i}].content", "only text parts (input_text, output_text)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InvalidRequestError(f"input[{i}].content", "must be text or a list of text parts")


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise InvalidRequestError(f"tools[{i}].type", f"{tool.get('type')!r} is not supported (function only)")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


@dataclass
class Reply:
    req: ResponsesRequest
    gen: Generation
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The Response object of a finished chat body."""
        choice = chat["choices"][0]
        msg = choice["message"]
        return self._response(msg.get("reasoning_content") or "", msg.get("content") or "",
                              msg.get("tool_calls") or [], choice["finish_reason"], chat["usage"])

    def _response(self, reasoning: str, text: str, calls: list[dict[str, Any]], finish: str | None,
                  usage: dict[str, Any]) -> dict[str, Any]:
        output: list[dict[str, Any]] = [self._reasoning(reasoning)] if reasoning else []
        if text or not calls:
            output.append(self._message(text))
        output += [self._call(c) for c in calls]
        incomplete = finish == "length"
        return {"id": self.id, "object": "response", "created_at": self.created, "model": self.gen.model,
                "status": "incomplete" if incomplete else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "output": output, "error": None, "instructions": self.req.instructions,
                "max_output_tokens": self.req.max_output_tokens, "parallel_tool_calls": self.req.parallel_tool_calls,
                "temperature": self.req.temperature, "top_p": self.req.top_p, "tools": self.req.tools or [],
                "tool_choice": self.req.tool_choice or "auto", "text": self.req.text or {"format": {"type": "text"}},
                "previous_response_id": None, "metadata": {},
                "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                          "total_tokens": usage["total_tokens"],
                          "input_tokens_details": {"cached_tokens": (usage.get("prompt_tokens_details") or {})
                                                   .get("cached_tokens", 0)},
                          "output_tokens_details": {"reasoning_tokens": 0}}}

    def _reasoning(self, text: str) -> dict[str, Any]:
        return {"type": "reasoning", "id": f"rs_{self.id[5:]}", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    def _message(self, text: str) -> dict[str, Any]:
        return {"type": "message", "id": f"msg_{self.id[5:]}", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    @staticmethod
    def _call(call: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function_call", "id": f"fc_{call['id'][5:]}", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}

    async def events(self, first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[str]:
        """The Responses stream: created, the thinking as one item once the answer starts,
        the message's text deltas as they come, each tool call once complete, then completed
        (with the whole Response). Items are announced in their output order."""
        self.gen.include_usage = True
        seq = iter(range(1 << 62))
        reasoning, text = "", ""
        calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        usage: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        opened = False

        def event(kind: str, **fields: Any) -> str:
            return render.sse({"type": kind, "sequence_number": next(seq), **fields})

        shell = self._response("", "", [], None, usage) | {"status": "in_progress", "output": []}
        yield event("response.created", response=shell)
        yield event("response.in_progress", response=shell)
        async for chunk in self.gen.chunks(first, rest):
            if "error" in chunk:
                yield event("error", code=str(chunk["error"]["code"]), message=chunk["error"]["message"], param=None)
                return
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                finish = choice.get("finish_reason") or finish
                reasoning += delta.get("reasoning_content", "")
                piece = delta.get("content") or ""
                if piece:
                    if not opened:
                        opened = True
                        if reasoning:
                            yield event("response.output_item.added", output_index=0, item=self._reasoning(reasoning))
                            yield event("response.output_item.done", output_index=0, item=self._reasoning(reasoning))
                        at = 1 if reasoning else 0
                        yield event("response.output_item.added", output_index=at,
                                    item=self._message("") | {"status": "in_progress", "content": []})
                        yield event("response.content_part.added", output_index=at, content_index=0,
                                    item_id=f"msg_{self.id[5:]}", part={"type": "output_text", "text": "",
                                                                        "annotations": []})
                    text += piece
                    yield event("response.output_text.delta", output_index=at, content_index=0,
                                item_id=f"msg_{self.id[5:]}", delta=piece, logprobs=[])
                for call in delta.get("tool_calls", []):
                    calls.setdefault(call["index"], {"id": call.get("id"), "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                    got = calls[call["index"]]
                    got["id"] = call.get("id") or got["id"]
                    got["function"]["name"] += (call.get("function") or {}).get("name") or ""
                    got["function"]["arguments"] += (call.get("function") or {}).get("arguments") or ""
        final = self._response(reasoning, text, [calls[i] for i in sorted(calls)], finish, usage)
        for index, item in enumerate(final["output"]):
            if item["type"] == "reasoning" and opened:
                continue  # sent when the answer began
            if item["type"] == "message" and opened:
                yield event("response.output_text.done", output_index=index, content_index=0, item_id=item["id"],
                            text=text, logprobs=[])
                yield event("response.content_part.done", output_index=index, content_index=0, item_id=item["id"],
                            part=item["content"][0])
            elif item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index, item=item | {"arguments": ""})
                yield event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                            arguments=item["arguments"], name=item["name"])
            elif item["type"] != "message" or not opened:
                yield event("response.output_item.added", output_index=index, item=item)
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed" if final["status"] == "completed" else "response.incomplete",
                    response=final)
