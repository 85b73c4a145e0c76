"""A decode worker that speculates, in a real mesh: exact over gRPC and HTTP, its drafts
counted in usage and in Prometheus, and no block left on any worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.telemetry.scrape import scrape, total
from tests.integration.mesh_tools import WORKER_ARGS, wait_idle
from tests.oracle import HFReference

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 64}
LOOP = [11, 12, 13, 14, 15] * 8  # a prompt n-gram lookup predicts well


@pytest.fixture(scope="module")
def spec_mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=0, worker_args=WORKER_ARGS,
                    http_port=0, decode_args=["--speculative-config", json.dumps(SPEC)],
                    router_args=["--info-interval-s", "0.2"],
                    log_dir=str(tmp_path_factory.mktemp("spec-mesh-logs")))
    with Mesh(spec) as m:
        yield m


def test_speculating_decode_worker_is_exact_and_counts_its_drafts(
    spec_mesh: Mesh, hf_refs: dict[str, HFReference]
) -> None:
    prompts = [LOOP, list(range(100, 130)) * 2, [7, 300, 42, 9, 81, 5, 600, 12]]
    decode = spec_mesh.decode[0]
    before = scrape(decode.metrics_address)
    with Client(spec_mesh.router_address, timeout=120) as client:
        outs = [client.complete(p, max_tokens=24, temperature=0) for p in prompts]
        off = client.complete(LOOP, max_tokens=24, temperature=0, num_speculative_tokens=0)
    assert [o.token_ids for o in outs] == [hf_refs["llama"].greedy(p, 24) for p in prompts]
    assert off.token_ids == outs[0].token_ids and off.spec_draft_tokens == 0
    assert outs[0].spec_draft_tokens > 0 and 0 < outs[0].spec_accepted_tokens <= outs[0].spec_draft_tokens
    after = scrape(decode.metrics_address)
    drafted = total(after, "pdmesh_spec_draft_tokens_total") - total(before, "pdmesh_spec_draft_tokens_total")
    accepted = total(after, "pdmesh_spec_accepted_tokens_total") - total(before, "pdmesh_spec_accepted_tokens_total")
    assert drafted == sum(o.spec_draft_tokens for o in outs)
    assert accepted == sum(o.spec_accepted_tokens for o in outs)
    assert total(after, "pdmesh_spec_acceptance_length_count") > 0
    wait_idle(spec_mesh)


def test_openai_usage_reports_drafts_as_predicted_outputs(spec_mesh: Mesh, hf_refs: dict[str, HFReference]) -> None:
    with openai.OpenAI(base_url=spec_mesh.http_url + "/v1", api_key="unused", timeout=120) as sdk:
        res = sdk.completions.create(model=spec_mesh.spec.model, prompt=LOOP, max_tokens=24, temperature=0)
        off = sdk.completions.create(model=spec_mesh.spec.model, prompt=LOOP, max_tokens=24, temperature=0,
                                     extra_body={"num_speculative_tokens": 0})
    details = res.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens > 0
    assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert res.choices[0].text == off.choices[0].text
    want = hf_refs["llama"].greedy(LOOP, 24)
    assert res.usage.completion_tokens == len(want)
    wait_idle(spec_mesh)
