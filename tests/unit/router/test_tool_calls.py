"""Tool-call parsers on the formats models write (fixtures as each model family's chat
template and documentation show them), and one choice's text split into content and
calls as it streams, chunk by chunk."""

from __future__ import annotations

import json

import pytest

from pdmesh.errors import InvalidRequestError
from services.router.http.schemas import ChatCompletionRequest
from services.router.tools.calls import CallStream, plan
from services.router.tools.parsers import PARSERS, ParsedCall

WEATHER = ParsedCall("get_weather", json.dumps({"city": "Paris", "days": 3}))
TIME = ParsedCall("get_time", json.dumps({"tz": "UTC"}))
FIXTURES = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
               "Let me check.", [WEATHER, TIME]),
    "llama3_json": ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
                    '{"name": "get_time", "parameters": {"tz": "UTC"}}', "", [WEATHER, TIME]),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
                '{"name": "get_time", "arguments": {"tz": "UTC"}}]', "", [WEATHER, TIME]),
    "pythonic": ('[get_weather(city="Paris", days=3), get_time(tz="UTC")]', "", [WEATHER, TIME]),
    "qwen3_xml": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                  "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n"
                  "</parameter>\n</function>\n</tool_call>", "", [WEATHER, TIME]),
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def _tools() -> list:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=TOOLS).tools or []


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_each_parser_reads_its_format(name: str) -> None:
    text, content, calls = FIXTURES[name]
    parser = PARSERS[name]()
    start = min(text.find(m) for m in parser.markers if m in text)
    parsed = parser.parse(text[start:])
    assert parsed is not None
    assert parsed[1] == calls
    assert (text[:start].strip() + parsed[0]).strip() == content


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_streamed_text_in_any_chunks_gives_the_same_calls_and_content(name: str, chunk: int) -> None:
    text, content, calls = FIXTURES[name]
    stream = CallStream(plan(_tools(), "auto", True, name))  # type: ignore[arg-type]
    sent = ""
    for i in range(0, len(text), chunk):
        out, deltas = stream.feed(text[i:i + chunk])
        sent += out
        assert deltas == []  # auto: calls come out once their text is complete
    rest, deltas = stream.finish()
    assert (sent + rest).strip() == content
    assert [(d["function"]["name"], d["function"]["arguments"]) for d in deltas] == \
        [(c.name, c.arguments) for c in calls]
    assert [d["index"] for d in deltas] == [0, 1] and all(d["id"].startswith("call_") for d in deltas)


def test_text_that_is_no_call_streams_as_content_and_a_broken_call_stays_content() -> None:
    stream = CallStream(plan(_tools(), "auto", True, "hermes"))  # type: ignore[arg-type]
    assert stream.feed("Plain answer <tool") == ("Plain answer ", [])  # may be a marker: held
    assert stream.feed("s> are fine") == ("<tools> are fine", [])
    assert stream.finish() == ("", [])
    broken = CallStream(plan(_tools(), "auto", True, "hermes"))  # type: ignore[arg-type]
    assert broken.feed("<tool_call>not json") == ("", [])
    assert broken.finish() == ("<tool_call>not json", [])
    prose = CallStream(plan(_tools(), "auto", True, "llama3_json"))  # type: ignore[arg-type]
    assert prose.feed("  ") == ("", [])
    assert prose.feed("Hello {") == ("  Hello {", [])


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    text = FIXTURES["hermes"][0]
    stream = CallStream(plan(_tools(), "auto", False, "hermes"))  # type: ignore[arg-type]
    stream.feed(text)
    _, deltas = stream.finish()
    assert [d["function"]["name"] for d in deltas] == ["get_weather"]


def test_named_function_streams_its_arguments_as_they_come() -> None:
    stream = CallStream(plan(_tools(), {"type": "function", "function": {"name": "get_time"}}, True, ""))
    _, first = stream.feed('{"tz"')
    _, second = stream.feed(': "UTC"}')
    assert first[0]["function"] == {"name": "get_time", "arguments": '{"tz"'} and first[0]["id"]
    assert second == [{"index": 0, "function": {"arguments": ': "UTC"}'}}]
    assert stream.calls[0]["function"]["arguments"] == '{"tz": "UTC"}'


def test_required_reads_the_grammar_held_list() -> None:
    p = plan(_tools(), "required", True, "")
    assert p is not None and p.structured is not None
    schema = json.loads(p.structured.json_schema or "")
    assert schema["minItems"] == 1 and "maxItems" not in schema
    stream = CallStream(p)
    stream.feed('[{"name": "get_time", "parameters": {"tz": "UTC"}}]')
    assert [d["function"]["name"] for d in stream.finish()[1]] == ["get_time"]
    assert json.loads(plan(_tools(), "required", False, "").structured.json_schema)["maxItems"] == 1  # type: ignore


@pytest.mark.parametrize(("tools", "choice", "parser", "field"), [
    (None, "required", "", "tool_choice"),
    (TOOLS, "auto", "", "tool_choice"),
    (TOOLS, None, "", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "", "tool_choice.function.name"),
    (TOOLS, {"type": "function"}, "", "tool_choice"),
    (TOOLS, "always", "", "tool_choice"),
    (TOOLS + TOOLS[:1], "required", "", "tools"),
])
def test_bad_tool_requests_name_the_field(tools: list | None, choice: object, parser: str, field: str) -> None:
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=tools)
    with pytest.raises(InvalidRequestError) as err:
        plan(req.tools, choice, True, parser)
    assert err.value.field == field
