"""The HTTP front's contract without workers: a real uvicorn server in the test's loop, a real
HTTP client; every error class answers with its status and OpenAI's error JSON."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.router.config import RouterConfig
from services.router.http.front import HTTPFront
from services.router.registry import Registry
from services.router.router import Router


async def _with_front(llama_dir: Path, calls: list[tuple[str, str, Any, dict[str, str]]],
                      api_key: str = "") -> list[tuple[int, Any, dict[str, str]]]:
    cfg = RouterConfig(model=str(llama_dir))
    front = HTTPFront(Router(cfg, Registry(cfg)), "127.0.0.1", 0, api_key)
    port = await front.start()
    out = []
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            for method, path, body, headers in calls:
                data = body if isinstance(body, str) else json.dumps(body) if body is not None else None
                hdrs = {"Content-Type": "application/json", **headers}
                async with http.request(method, path, data=data, headers=hdrs) as resp:
                    text = await resp.text()
                    parsed = json.loads(text) if text and resp.content_type == "application/json" else text
                    out.append((resp.status, parsed, dict(resp.headers)))
    finally:
        await front.stop()
    return out


def run(llama_dir: Path, calls: list[tuple[str, str, Any, dict[str, str]]], api_key: str = ""
        ) -> list[tuple[int, Any, dict[str, str]]]:
    return asyncio.run(_with_front(llama_dir, calls, api_key))


def test_errors_have_their_status_and_openai_shape(llama_dir: Path) -> None:
    m = str(llama_dir)
    cases = [
        ("POST", "/v1/completions", "{not json", 400, None),
        ("POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
        ("POST", "/v1/completions", {"model": m}, 400, "prompt"),
        ("POST", "/v1/completions", {"model": "gpt-9", "prompt": "hi"}, 404, "model"),
        ("POST", "/v1/completions", {"model": m, "prompt": "hi", "suffix": "x"}, 400, "suffix"),
        ("POST", "/v1/completions", {"model": m, "prompt": "hi", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
        ("POST", "/v1/completions", {"model": m, "prompt": "hi", "top_p": 7}, 400, "top_p"),
        ("POST", "/v1/completions", {"model": m, "prompt": [5, 10**7]}, 400, "prompt"),
        ("POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
        ("POST", "/v1/chat/completions", {"model": m, "messages": []}, 400, "messages"),
        ("POST", "/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages"),
        # Valid, but no worker can take it: 503 with a retry hint.
        ("POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 2}, 503, None),
    ]
    results = run(llama_dir, [(meth, path, body, {}) for meth, path, body, _, _ in cases])
    for (_, _, body, status, param), (got, payload, headers) in zip(cases, results):
        assert got == status, (body, payload)
        err = payload["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], payload
        if param is not None:
            assert err["param"] == param or param in err["message"], payload
        if status == 503:
            assert headers.get("Retry-After") == "1"


def test_models_health_tokenize_detokenize_metrics(llama_dir: Path) -> None:
    (s1, models, _), (s2, health, _), (s3, tok, _), (s4, detok, _), (s5, metrics, _) = run(llama_dir, [
        ("GET", "/v1/models", None, {}),
        ("GET", "/health", None, {}),
        ("POST", "/tokenize", {"prompt": "def main():"}, {}),
        ("POST", "/detokenize", {"tokens": [0, 5, 6]}, {}),
        ("GET", "/metrics", None, {}),
    ])
    assert s1 == 200 and models["data"][0]["id"] == llama_dir.name
    assert s2 == 503 and "no healthy decode worker" in health["error"]["message"]
    assert s3 == 200 and tok["tokens"][0] == 0 and tok["count"] == len(tok["tokens"])
    assert s4 == 200 and isinstance(detok["prompt"], str) and detok["prompt"]
    assert s5 == 200 and "pdmesh_requests_in_flight" in metrics


def test_api_key_guards_v1_routes(llama_dir: Path) -> None:
    (no, body, _), (wrong, _, _), (ok, _, _), (health, _, _) = run(llama_dir, [
        ("GET", "/v1/models", None, {}),
        ("GET", "/v1/models", None, {"Authorization": "Bearer nope"}),
        ("GET", "/v1/models", None, {"Authorization": "Bearer s3cret"}),
        ("GET", "/health", None, {}),
    ], api_key="s3cret")
    assert (no, wrong, ok) == (401, 401, 200)
    assert "Authorization: Bearer" in body["error"]["message"]
    assert health == 503  # not a /v1 route: no key needed (and no workers here)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streaming_requests_fail_before_the_stream_starts(llama_dir: Path, path: str) -> None:
    body: dict[str, Any] = {"model": llama_dir.name, "stream": True, "max_tokens": 2}
    body |= {"prompt": "hi"} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]}
    [(status, payload, _)] = run(llama_dir, [("POST", path, body, {})])
    assert status == 503 and payload["error"]["type"] == "ServiceUnavailableError"


def test_a_body_beyond_the_limit_is_413_before_it_is_read(llama_dir: Path) -> None:
    body = {"model": llama_dir.name, "prompt": "x" * (9 * 2**20)}
    [(status, payload, _)] = run(llama_dir, [("POST", "/v1/completions", body, {})])
    assert status == 413 and "max-request-mb" in payload["error"]["message"]


def test_values_json_allows_but_nothing_downstream_takes_are_400s(llama_dir: Path) -> None:
    """Found by throwing odd bodies at a live mesh: each of these was a 500 (a lone UTF-16
    surrogate reached the tokenizer, protobuf or a gRPC header; a number too wide for its
    protobuf field; a negative token id)."""
    m, hi = str(llama_dir), {"role": "user", "content": "hi"}
    lone = "a\ud800b"
    cases = [
        ("/v1/completions", {"model": m, "prompt": lone}, "prompt"),
        ("/v1/completions", {"model": m, "prompt": ["ok", lone]}, "prompt[1]"),
        ("/v1/completions", {"model": m, "prompt": "hi", "stop": lone}, "stop"),
        ("/v1/completions", {"model": m, "prompt": "hi", "stop": ["x", lone]}, "stop[1]"),
        ("/v1/completions", {"model": m, "prompt": "hi", "cache_salt": lone}, "cache_salt"),
        ("/v1/completions", {"model": m, "prompt": "hi", "request_id": lone}, "request_id"),
        ("/v1/completions", {"model": m, "prompt": "hi", lone: 1}, "body"),  # even a field's name
        ("/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": [
            {"type": "text", "text": lone}]}]}, "messages[0].content[0].text"),
        ("/tokenize", {"prompt": lone}, "prompt"),
        ("/v1/completions", {"model": m, "prompt": "hi", "top_k": 2**31}, "top_k"),
        ("/v1/chat/completions", {"model": m, "messages": [hi], "top_k": 2**63}, "top_k"),
        ("/v1/completions", {"model": m, "prompt": "hi", "stop_token_ids": [2**40]}, "stop_token_ids"),
        ("/v1/completions", {"model": m, "prompt": [-5]}, "prompt"),
        ("/v1/completions", {"model": m, "prompt": [-5], "stream": True}, "prompt"),
        ("/detokenize", {"tokens": [-1]}, "token_ids"),
    ]
    results = run(llama_dir, [("POST", path, body, {}) for path, body, _ in cases])
    for (_, body, param), (status, payload, _) in zip(cases, results):
        assert status == 400, (body, payload)
        err = payload["error"]
        assert err["type"] == "BadRequestError" and (err["param"] == param or param in err["message"]), payload


def test_features_pdmesh_lacks_are_refused_not_ignored(llama_dir: Path) -> None:
    """Ignoring a logit bias or a JSON schema would return output the caller did not ask
    for: 400 naming the field. Their "off" values pass (to the 503 of a mesh without workers)."""
    m, hi = str(llama_dir), [{"role": "user", "content": "hi"}]
    refused = [
        ("/v1/completions", {"model": m, "prompt": "hi", "logit_bias": {"5": 100}}, "logit_bias"),
        ("/v1/completions", {"model": m, "prompt": "hi", "best_of": 3}, "best_of"),
        ("/v1/chat/completions", {"model": m, "messages": hi, "functions": [{"name": "f"}]}, "functions"),
        ("/v1/completions", {"model": m, "prompt": "hi", "truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),
    ]
    off = [
        ("/v1/completions", {"model": m, "prompt": "hi", "logit_bias": {}, "best_of": 2, "n": 2}),
        ("/v1/chat/completions", {"model": m, "messages": hi, "response_format": {"type": "text"},
                                  "tools": [], "tool_choice": "none"}),
    ]
    results = run(llama_dir, [("POST", path, body, {}) for path, body, *_ in refused + off])
    for (_, body, param), (status, payload, _) in zip(refused, results):
        assert status == 400 and payload["error"]["param"] == param, (body, payload)
        assert "not supported by pdmesh" in payload["error"]["message"]
    for (_, body), (status, payload, _) in zip(off, results[len(refused):]):
        assert status == 503, (body, payload)  # accepted; no worker to run it here


def test_bad_structured_outputs_and_tools_are_400s_naming_the_field(llama_dir: Path) -> None:
    """Refused before any worker is chosen (the router compiles the grammar first); the
    valid ones reach the 503 of a mesh without workers."""
    m, hi = str(llama_dir), [{"role": "user", "content": "hi"}]
    weather = {"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    bad_params = {"type": "function", "function": {"name": "b", "parameters": {"type": "strin"}}}
    chat = "/v1/chat/completions"
    refused = [
        (chat, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format.json_schema.schema"),
        (chat, {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (chat, {"response_format": {"type": "yaml"}}, "response_format.type"),
        ("/v1/completions", {"guided_regex": "[0-9"}, "guided_regex"),
        ("/v1/completions", {"guided_choice": []}, "guided_choice"),
        (chat, {"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs.grammar"),
        (chat, {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        (chat, {"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        (chat, {"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        (chat, {"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name"),
        (chat, {"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice.function.name"),
        (chat, {"tool_choice": "required"}, "tool_choice"),
        (chat, {"tools": [weather, bad_params], "tool_choice": {"type": "function", "function": {"name": "b"}}},
         "tools[1].function.parameters"),
        (chat, {"tools": [weather]}, "tool_choice"),  # auto, and this router has no --tool-call-parser
        (chat, {"tools": [weather], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
    ]
    accepted = [
        (chat, {"response_format": {"type": "json_object"}}),
        (chat, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                           "schema": {"type": "object"}}}}),
        ("/v1/completions", {"guided_choice": ["a", "b"]}),
        (chat, {"tools": [weather], "tool_choice": "required"}),
        (chat, {"tools": [weather], "tool_choice": "none"}),
    ]
    def body(path: str, extra: dict[str, Any]) -> dict[str, Any]:
        return {"model": m, **({"messages": hi} if path == chat else {"prompt": "hi"}), **extra}
    results = run(llama_dir, [("POST", path, body(path, extra), {}) for path, extra, *_ in refused + accepted])
    for (_, extra, param), (status, payload, _) in zip(refused, results):
        assert status == 400 and payload["error"]["param"] == param, (extra, payload)
    for (_, extra), (status, payload, _) in zip(accepted, results[len(refused):]):
        assert status == 503, (extra, payload)


def test_the_frameworks_own_refusals_have_openais_shape(llama_dir: Path) -> None:
    """An unparseable body (here nested deeper than the JSON parser goes), an unknown route
    and a wrong method: each its status, in the same error JSON as every other error."""
    deep = '{"model": "m", "prompt": "hi", "x": ' + "[" * 100_000 + "1" + "]" * 100_000 + "}"
    (s1, p1, _), (s2, p2, _), (s3, p3, h3) = run(llama_dir, [
        ("POST", "/v1/completions", deep, {}),
        ("GET", "/v1/nothing", None, {}),
        ("GET", "/v1/completions", None, {}),
    ])
    assert (s1, s2, s3) == (400, 404, 405)
    for payload in (p1, p2, p3):
        assert set(payload["error"]) == {"message", "type", "param", "code"} and payload["error"]["message"]
    assert h3.get("Allow") == "POST"
