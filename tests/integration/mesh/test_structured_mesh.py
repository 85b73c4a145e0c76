"""Structured outputs and tool calls through the mesh, as the ``openai`` SDK sends them: the
prefill worker samples the first token under the grammar, the decode worker goes on from
it; every output validates whatever the (random) weights, streamed or not, with n = 3."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import grpc
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from tests.integration.mesh_tools import start_router, wait_idle


class Part(BaseModel):
    kind: Literal["bolt", "nut", "gear"]
    count: int = Field(ge=1, le=50)


class Order(BaseModel):
    customer: str = Field(max_length=12)
    rush: bool
    parts: list[Part] = Field(min_length=1, max_length=3)


NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "status": {"type": "string", "enum": ["open", "closed", "held"]},
        "labels": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2, "maxItems": 4},
        "owner": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                   "team": {"type": "string", "enum": ["a", "b"]}},
                  "required": ["name", "team"], "additionalProperties": False},
    },
    "required": ["id", "status", "labels", "owner"],
    "additionalProperties": False,
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["tz"], "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture()
def sdk(mesh: Mesh) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=mesh.http_url + "/v1", api_key="unused", timeout=120) as c:
        yield c


def _model(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


def _first_choice(sdk: openai.OpenAI, stream: bool, kwargs: dict[str, Any]) -> Any:
    """The first choice of a chat completion, assembled by the SDK's stream helper or whole."""
    if stream:
        with sdk.chat.completions.stream(**kwargs) as s:
            return s.get_final_completion().choices[0]
    return sdk.chat.completions.create(**kwargs).choices[0]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"order number {i}: {'bolts ' * (i % 5)}please"}]


def test_parse_with_a_pydantic_model_for_20_prompts_streamed_and_not(mesh: Mesh, sdk: openai.OpenAI) -> None:
    model, parsed = _model(sdk), 0
    for i in range(20):
        r = sdk.chat.completions.parse(model=model, messages=_messages(i), response_format=Order, n=3, seed=i,
                                       temperature=0.9, max_tokens=200)
        for choice in r.choices:
            assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Order)
            parsed += 1
        with sdk.chat.completions.stream(model=model, messages=_messages(i), response_format=Order, n=3,
                                         seed=i, temperature=0.9, max_tokens=200) as stream:
            final = stream.get_final_completion()
        # The same seed streamed: the same objects.
        assert [c.message.parsed for c in final.choices] == [c.message.parsed for c in r.choices]
    assert parsed == 60
    wait_idle(mesh)


def test_json_schema_regex_and_choice_outputs_all_validate(mesh: Mesh, sdk: openai.OpenAI) -> None:
    model = _model(sdk)
    fmt = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": NESTED, "strict": True}}
    for i in range(8):
        r = sdk.chat.completions.create(model=model, messages=_messages(i), response_format=fmt,  # type: ignore
                                        n=2, seed=i, temperature=1.0, max_tokens=200)
        for c in r.choices:
            jsonschema.validate(json.loads(c.message.content or ""), NESTED)
        obj = sdk.chat.completions.create(model=model, messages=_messages(i), max_tokens=200, seed=i,
                                          response_format={"type": "json_object"}, temperature=0)
        assert obj.choices[0].finish_reason in ("stop", "length")  # free JSON may run to max_tokens
        regex = sdk.completions.create(model=model, prompt=f"code {i}:", max_tokens=40, seed=i, temperature=1.0,
                                       extra_body={"structured_outputs": {"regex": r"[A-Z]{3}-[0-9]{4}"}})
        assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", regex.choices[0].text)
        choice = sdk.completions.create(model=model, prompt=f"pick {i}:", max_tokens=10, seed=i, temperature=1.0,
                                        extra_body={"guided_choice": ["alpha", "beta", "gamma ray"]})
        assert choice.choices[0].text in ("alpha", "beta", "gamma ray")
    wait_idle(mesh)


def test_grpc_front_takes_the_same_constraint(client: Client) -> None:
    out = client.complete("a ticket:", max_tokens=200, temperature=0.7, seed=3,
                          structured_output={"json_schema": json.dumps(NESTED)})
    jsonschema.validate(json.loads(out.text), NESTED)
    for bad, field in [({"regex": "[0-9"}, "structured_output.regex"), ({}, "structured_output"),
                       ({"json_object": False}, "structured_output.json_object"),
                       ({"choice": {"choices": []}}, "structured_output.choice")]:
        with pytest.raises(grpc.RpcError) as err:
            client.complete("x", max_tokens=4, structured_output=bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_calls_validate_against_the_functions_schema(sdk: openai.OpenAI,
                                                                             stream: bool) -> None:
    model = _model(sdk)
    choices = [("required", False), ({"type": "function", "function": {"name": "get_weather"}}, True)]
    for i in range(6):
        for tool_choice, parallel in choices:
            kwargs = dict(model=model, messages=_messages(i), tools=TOOLS, tool_choice=tool_choice, seed=i,
                          temperature=1.0, max_tokens=120, parallel_tool_calls=parallel)
            msg = _first_choice(sdk, stream, kwargs)
            assert msg.finish_reason == "tool_calls"
            calls = msg.message.tool_calls or []
            assert len(calls) == 1
            for call in calls:
                assert call.id.startswith("call_") and call.type == "function"
                if isinstance(tool_choice, dict):
                    assert call.function.name == "get_weather"
                jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_calls_are_read_by_the_routers_parser(sdk: openai.OpenAI, stream: bool) -> None:
    """The shared mesh's router reads hermes calls. Random weights do not write that format,
    so a grammar steers the output into it; the parser reads whatever text arrives."""
    call = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo|Lima)", "days": [1-7]\}\}\n</tool_call>'
    kwargs = dict(model=_model(sdk), messages=_messages(1), tools=TOOLS, max_tokens=150, temperature=1.0, seed=4,
                  extra_body={"structured_outputs": {"regex": "Checking[.] " + call + "\n" + call}})
    choice = _first_choice(sdk, stream, kwargs)
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.content or "").strip() == "Checking."
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), WEATHER)


def test_a_tool_result_goes_back_through_the_template(sdk: openai.OpenAI) -> None:
    first = sdk.chat.completions.create(model=_model(sdk), messages=_messages(2), tools=TOOLS, max_tokens=60,
                                        tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = (first.choices[0].message.tool_calls or [])[0]
    follow = sdk.chat.completions.create(model=_model(sdk), tools=TOOLS, tool_choice="none", max_tokens=8,
                                         messages=[*_messages(2), first.choices[0].message.model_dump(),  # type: ignore
                                                   {"role": "tool", "tool_call_id": call.id, "content": "12:00"}])
    assert follow.choices[0].message.tool_calls is None
    assert follow.usage is not None and follow.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_a_reasoning_parser_splits_thinking_from_the_answer(mesh: Mesh, tmp_path: Path, parser: str) -> None:
    """A second router with --reasoning-parser. Random weights write no ``</think>``:
    deepseek_r1 (the template opened the block) reads it all as thinking, qwen3 (no block
    opened) as the answer; streamed or not, the same split."""
    proc, _ = start_router(mesh, tmp_path, "--reasoning-parser", parser, "--http-port", "0")
    try:
        url = f"http://127.0.0.1:{(tmp_path / 'router2.port.http').read_text().strip()}/v1"
        with openai.OpenAI(base_url=url, api_key="unused", timeout=120) as sdk:
            kwargs = dict(model=_model(sdk), messages=_messages(3), max_tokens=12, temperature=0)
            whole = sdk.chat.completions.create(**kwargs).choices[0].message  # type: ignore[call-overload]
            parts = {"reasoning_content": "", "content": ""}
            for chunk in sdk.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
                delta = chunk.choices[0].delta if chunk.choices else None
                for key in parts:
                    parts[key] += (getattr(delta, key, None) or "") if delta is not None else ""
        thinking = getattr(whole, "reasoning_content", None)
        if parser == "deepseek_r1":
            assert thinking and whole.content is None
        else:
            assert thinking is None and whole.content
        assert (parts["reasoning_content"] or None, parts["content"] or None) == (thinking, whole.content)
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_responses_api_through_the_sdk(sdk: openai.OpenAI) -> None:
    """``/v1/responses`` as the SDK calls it: text, a JSON schema, a required function call
    and its output sent back, streamed and not; a stored response asked for is a 400."""
    model = _model(sdk)
    plain = sdk.responses.create(model=model, input="Say hi", max_output_tokens=8, temperature=0)
    assert plain.status == "incomplete" and plain.output_text and plain.usage.output_tokens == 8  # type: ignore
    fmt = {"format": {"type": "json_schema", "name": "ticket", "schema": NESTED, "strict": True}}
    for stream in (False, True):
        if stream:
            with sdk.responses.stream(model=model, input="a ticket", text=fmt, max_output_tokens=200,  # type: ignore
                                      temperature=1.0) as s:
                deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
                done = s.get_final_response()
            assert "".join(deltas) == done.output_text
        else:
            done = sdk.responses.create(model=model, input="a ticket", text=fmt, max_output_tokens=200,  # type: ignore
                                        temperature=1.0)
        assert done.status == "completed"
        jsonschema.validate(json.loads(done.output_text), NESTED)
    flat = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
            for t in TOOLS]
    called = sdk.responses.create(model=model, input="weather?", tools=flat, tool_choice="required",  # type: ignore
                                  parallel_tool_calls=False, max_output_tokens=100, temperature=1.0)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    follow = sdk.responses.create(model=model, max_output_tokens=4, tools=flat, tool_choice="none",  # type: ignore
                                  input=[{"role": "user", "content": "weather?"}, calls[0].model_dump(),
                                         {"type": "function_call_output", "call_id": calls[0].call_id,
                                          "output": "sunny"}])
    assert follow.output_text and follow.usage.input_tokens > called.usage.input_tokens  # type: ignore
    with pytest.raises(openai.BadRequestError) as err:
        sdk.responses.create(model=model, input="x", previous_response_id="resp_123")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
