"""The OpenAI-compatible HTTP front against the real mesh, driven by the official SDK."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from tests.integration.mesh_tools import wait_idle
from tests.oracle import HFReference, mixed_prompts


@pytest.fixture()
def sdk(mesh: Mesh) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=mesh.http_url + "/v1", api_key="unused", timeout=120) as c:
        yield c


def test_greedy_over_http_equals_grpc_and_transformers(mesh: Mesh, sdk: openai.OpenAI, client: Client,
                                                       hf_refs) -> None:  # type: ignore[no-untyped-def]
    ref: HFReference = hf_refs["llama"]
    model = mesh.spec.model
    for prompt in mixed_prompts(4, seed=51)[1:]:
        http = sdk.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"return_token_ids": True})
        grpc_out = client.complete(prompt, max_tokens=12, temperature=0)
        want = ref.greedy(prompt, 12)
        assert http.choices[0].token_ids == grpc_out.token_ids == want  # type: ignore[attr-defined]
        assert http.choices[0].text == grpc_out.text
        assert http.usage.prompt_tokens == len(prompt) and http.usage.completion_tokens == 12


def test_streaming_chat_n2_logprobs_stop_and_seed(mesh: Mesh, sdk: openai.OpenAI) -> None:
    model = mesh.spec.model
    msgs = [{"role": "user", "content": "def fibonacci(n):"}]
    chunks = list(sdk.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, n=2,
                                              stream=True, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    for ch in chunks[:-1]:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1] and texts[0]  # greedy: both completions agree
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    whole = sdk.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0,
                                        logprobs=True, top_logprobs=3)
    assert whole.choices[0].message.content == texts[0]
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert len(content) == 8 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob >= t.top_logprobs[0].logprob - 1e-5 for t in content[:1])
    seeded = [sdk.completions.create(model=model, prompt="import os\n", max_tokens=10, temperature=1.0,
                                     seed=7).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]
    full = sdk.completions.create(model=model, prompt="import os\n", max_tokens=10, temperature=0)
    word = full.choices[0].text.strip().split()[0]
    stopped = sdk.completions.create(model=model, prompt="import os\n", max_tokens=10, temperature=0, stop=[word])
    assert word not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


def test_completion_logprobs_and_echo(mesh: Mesh, sdk: openai.OpenAI) -> None:
    out = sdk.completions.create(model=mesh.spec.model, prompt="x = 1", max_tokens=5, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == 5 and len(lp.top_logprobs) == 5 and lp.text_offset[0] == 0
    echo = sdk.completions.create(model=mesh.spec.model, prompt="x = 1", max_tokens=5, temperature=0, echo=True)
    assert echo.choices[0].text == "x = 1" + out.choices[0].text


def test_http_errors_come_back_as_openai_errors(mesh: Mesh, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=mesh.spec.model, prompt="hi", max_tokens=2, temperature=-1)
    assert "temperature" in str(err.value)


def test_disconnecting_an_sse_stream_frees_every_block(mesh: Mesh) -> None:
    body = json.dumps({"model": mesh.spec.model, "prompt": list(range(5, 200)), "max_tokens": 300,
                       "ignore_eos": True, "stream": True}).encode()
    for _ in range(3):
        req = urllib.request.Request(mesh.http_url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        resp = urllib.request.urlopen(req, timeout=60)
        for _ in range(4):  # a few tokens, then hang up mid-stream
            assert resp.readline()
        resp.close()
    for name, info in wait_idle(mesh).items():
        assert info.used_blocks == 0 and info.num_handoffs == 0, name


def test_skip_special_tokens_false_keeps_them_in_the_text(mesh: Mesh, sdk: openai.OpenAI, client: Client) -> None:
    """Over both fronts the option reaches the worker that makes the text: the same seeded
    tokens read with their special tokens, or without them (the default)."""
    from pdmesh.tokenizer import Tokenizer

    tok = Tokenizer(mesh.spec.model)
    options = dict(max_tokens=32, temperature=3.0, ignore_eos=True)
    for seed in range(100):  # a flat distribution: some seed samples a special token early
        kept = client.complete("hello", seed=seed, skip_special_tokens=False, **options)
        if tok.special_ids & set(kept.token_ids):
            break
    else:
        pytest.fail("no seed of 100 sampled a special token")
    marks = {tok.decode([t], skip_special_tokens=False) for t in tok.special_ids & set(kept.token_ids)}
    skipped = client.complete("hello", seed=seed, **options)
    assert skipped.token_ids == kept.token_ids
    # The streamed text is the whole decode's, less a last character the tokens left unfinished.
    assert tok.decode(kept.token_ids, skip_special_tokens=False).startswith(kept.text)
    assert tok.decode(kept.token_ids, skip_special_tokens=True).startswith(skipped.text)
    assert all(m in kept.text for m in marks) and not any(m in skipped.text for m in marks), marks
    http = sdk.completions.create(model=mesh.spec.model, prompt="hello", seed=seed, max_tokens=32, temperature=3.0,
                                  extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert http.choices[0].text == kept.text
