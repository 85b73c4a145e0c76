"""Odd request bodies against the live mesh's HTTP front: every one gets a status a client
can act on (never a 500), a stream never ends in an internal error, and no worker keeps a
block afterwards. The values are the kinds that once reached the tokenizer, protobuf or a
gRPC header unchecked: lone UTF-16 surrogates, integers wider than the wire's fields,
negative ids, non-finite numbers, wrong types, and fields pdmesh does not implement."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from typing import Any

from pdmesh.launcher import Mesh
from tests.integration.mesh_tools import wait_idle

ODD: list[Any] = [None, 0, -1, 1, 2**31, 2**63, 2**64 + 5, -(2**63) - 1, 1e308, -0.5, 1.5, "x", "", [], {}, True,
                  [1, 2], [-1], [2**40], ["a", ""], "a\ud800b", "\x00", "y" * 5000, {"5": 100}]
FIELDS = ["max_tokens", "n", "temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty",
          "stream", "stream_options", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
          "stop_token_ids", "include_stop_str_in_output", "priority", "num_speculative_tokens", "cache_salt",
          "return_token_ids", "request_id", "user", "logit_bias", "best_of", "response_format", "tools",
          "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "prompt_logprobs"]
COMPLETION_ONLY = ["logprobs", "echo", "suffix", "prompt"]
CHAT_ONLY = ["logprobs", "top_logprobs", "max_completion_tokens", "add_generation_prompt", "messages", "tools",
             "tool_choice", "parallel_tool_calls"]
RESPONSES = ["input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "temperature",
             "previous_response_id", "stream"]
SEED = 20261129


def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _cases(model: str) -> list[tuple[str, dict[str, Any]]]:
    completion = {"model": model, "prompt": "hi", "max_tokens": 2}
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [("/v1/completions", completion | {f: v}) for f in FIELDS + COMPLETION_ONLY for v in ODD]
    cases += [("/v1/chat/completions", chat | {f: v}) for f in CHAT_ONLY for v in ODD]
    responses = {"model": model, "input": "hi", "max_output_tokens": 2}
    cases += [("/v1/responses", responses | {f: v}) for f in RESPONSES for v in ODD]
    rng = random.Random(SEED)  # pairs of odd fields, half of them streamed
    for _ in range(150):
        path, base, extra = rng.choice([("/v1/completions", completion, COMPLETION_ONLY),
                                        ("/v1/chat/completions", chat, CHAT_ONLY)])
        f1, f2 = rng.sample(FIELDS + extra, 2)
        cases.append((path, base | {f1: rng.choice(ODD), f2: rng.choice(ODD), "stream": rng.random() < 0.5}))
    cases += [("/tokenize", {"prompt": v}) for v in ODD] + [("/detokenize", {"tokens": v}) for v in ODD]
    return cases


def test_no_body_gets_a_500_or_leaks_a_block(mesh: Mesh) -> None:
    failures = []
    for path, body in _cases(mesh.spec.model):
        status, text = _post(mesh.http_url + path, body)
        marker = '"type":"error"' if path == "/v1/responses" else '"error"'  # a Response has "error": null
        streamed_error = status == 200 and body.get("stream") is True and marker in text
        if status >= 500 or streamed_error:
            shown = {k: (v[:12] + "..." if isinstance(v, str) and len(v) > 12 else v) for k, v in body.items()}
            failures.append(f"{path} {shown} -> {status} {text[-200:]}")
    assert not failures, f"{len(failures)} bodies failed:\n" + "\n".join(failures[:20])
    wait_idle(mesh)
