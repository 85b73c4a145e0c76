"""Prompt logprobs through the mesh: computed by the prefill worker (chunked: the shared
mesh prefills 64 tokens a step), sent on the first message, equal to transformers'
log-softmax of the prompt (1e-4, float32) on both fronts, whole and streamed, and as the
completions API's ``echo`` with ``logprobs``. A prompt already in the prefix cache is
computed again for them."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from tests.oracle import HFReference, mixed_prompts

TOL = 1e-4


@pytest.fixture()
def sdk(mesh: Mesh) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=mesh.http_url + "/v1", api_key="unused", timeout=120) as c:
        yield c


def _prompts() -> list[list[int]]:
    return [p for p in mixed_prompts(6, seed=12) if len(p) > 2] + [list(range(40, 170))]  # 130 tokens: 3 chunks


def test_grpc_prompt_logprobs_equal_transformers(client: Client, hf_refs: dict[str, HFReference]) -> None:
    ref = hf_refs["llama"]
    for prompt in _prompts():
        for attempt in range(2):  # the second time the prompt is cached: computed again all the same
            first = next(iter(client.generate(prompt, max_tokens=3, temperature=0, prompt_logprobs=2)))
            want = ref.logprobs(prompt)
            got = list(first.prompt_logprobs)
            assert [lp.token_id for lp in got] == prompt[1:], attempt
            for i, lp in enumerate(got):
                assert abs(lp.logprob - float(want[i, prompt[i + 1]])) < TOL
                assert [t.token_id for t in lp.top] == want[i].topk(2).indices.tolist()
                assert lp.rank == int((want[i] > want[i, prompt[i + 1]]).sum()) + 1


def test_http_prompt_logprobs_and_echo_with_logprobs(sdk: openai.OpenAI, hf_refs: dict[str, HFReference]) -> None:
    ref = hf_refs["llama"]
    model = sdk.models.list().data[0].id
    for prompt in _prompts()[:3]:
        want = ref.logprobs(prompt)
        r = sdk.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0,
                                   extra_body={"prompt_logprobs": 1})
        plp = r.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
        assert plp[0] is None and len(plp) == len(prompt)
        for i, entry in enumerate(plp[1:]):
            own = entry[str(prompt[i + 1])]
            assert abs(own["logprob"] - float(want[i, prompt[i + 1]])) < TOL
        echoed = sdk.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0, echo=True,
                                        logprobs=1)
        lps = echoed.choices[0].logprobs
        assert lps is not None and lps.token_logprobs is not None
        assert lps.token_logprobs[0] is None and len(lps.token_logprobs) == len(prompt) + 2
        for i in range(1, len(prompt)):
            assert abs(lps.token_logprobs[i] - float(want[i - 1, prompt[i]])) < TOL
        streamed = sdk.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0, echo=True,
                                          logprobs=1, stream=True)
        values: list[float | None] = []
        for chunk in streamed:
            if chunk.choices and chunk.choices[0].logprobs is not None:
                values += chunk.choices[0].logprobs.token_logprobs or []
        assert values[0] is None and len(values) == len(prompt) + 2
        assert all(math.isclose(a, b, abs_tol=TOL) for a, b in zip(values[1:], lps.token_logprobs[1:]))
