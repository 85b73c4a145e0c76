"""One chat choice's generated text, read as the API returns it: the thinking (a reasoning
parser's ``reasoning_content``), then the answer, of which tool calls are read out (the
tool plan's ``CallStream``) and the rest is ``content``. Whole or as it streams."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.router.reasoning import ReasoningSplit
from services.router.tools.calls import CallStream


@dataclass
class Piece:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def delta(self) -> dict[str, Any]:
        """The SSE ``delta`` of this piece (only what it has)."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


@dataclass
class ChatAnswer:
    thinking: ReasoningSplit | None
    calls: CallStream | None

    def read(self, text: str, final: bool) -> Piece:
        """What ``text`` (the next streamed text; all of it with ``final`` for a whole
        response) adds; ``final`` also flushes what was held."""
        piece = Piece(content=text)
        if self.thinking is not None:
            piece.reasoning, piece.content = self.thinking.feed(text)
            if final:
                reasoning, content = self.thinking.finish()
                piece.reasoning += reasoning
                piece.content += content
        if self.calls is not None:
            piece.content, piece.tool_calls = self.calls.feed(piece.content)
            if final:
                rest, more = self.calls.finish()
                piece.content += rest
                piece.tool_calls += more
        return piece

    @property
    def made_calls(self) -> bool:
        return self.calls is not None and bool(self.calls.calls)

    @property
    def all_calls(self) -> list[dict[str, Any]]:
        return self.calls.calls if self.calls is not None else []
