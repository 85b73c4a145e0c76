"""A reasoning model's text split into thinking and answer, whole and in chunks of any size,
and read on into tool calls."""

from __future__ import annotations

import pytest

from services.router.http.answer import ChatAnswer
from services.router.reasoning import ReasoningSplit
from services.router.tools.calls import CallStream, plan

CASES = [
    ("deepseek_r1", "Let me see: 2 < 3.\n</think>\n\nThree.", "Let me see: 2 < 3.\n", "\n\nThree."),
    ("deepseek_r1", "<think>again</think>ok", "again", "ok"),
    ("deepseek_r1", "never closed <th", "never closed <th", ""),
    ("qwen3", "<think>\nhm</think>\nYes", "\nhm", "\nYes"),
    ("qwen3", "  <think>x</think>y", "x", "y"),
    ("qwen3", "No thinking <think> here", "", "No thinking <think> here"),
    ("qwen3", "<th", "", "<th"),
    ("qwen3", "<think>cut off", "cut off", ""),
]


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
@pytest.mark.parametrize("chunk", [1, 2, 5, 1000])
def test_thinking_and_answer_come_apart_in_any_chunks(parser: str, text: str, reasoning: str, content: str,
                                                       chunk: int) -> None:
    split = ReasoningSplit(parser)  # type: ignore[arg-type]
    got_r, got_c = "", ""
    for i in range(0, len(text), chunk):
        r, c = split.feed(text[i:i + chunk])
        got_r, got_c = got_r + r, got_c + c
    r, c = split.finish()
    assert (got_r + r, got_c + c) == (reasoning, content)


def test_tool_calls_are_read_from_the_answer_only() -> None:
    from services.router.http.schemas import ChatCompletionRequest

    tools = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]).tools
    answer = ChatAnswer(ReasoningSplit("deepseek_r1"), CallStream(plan(tools, "auto", True, "hermes")))  # type: ignore
    text = 'maybe <tool_call> later</think>Calling.<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    pieces = [answer.read(text[i:i + 7], final=i + 7 >= len(text)) for i in range(0, len(text), 7)]
    assert "".join(p.reasoning for p in pieces) == "maybe <tool_call> later"
    assert "".join(p.content for p in pieces) == "Calling."
    assert [c["function"]["name"] for p in pieces for c in p.tool_calls] == ["f"]
    assert answer.made_calls
