"""The engine's side of disaggregation, in process: a prefill engine holds a prompt's KV, the
blocks are copied into a decode engine's reservation, the decode engine commits the first
token and continues. The hand-off lives in the sequences' status; tokens equal transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.errors import UnknownRequestError
from pdmesh.request import SeqStatus
from pdmesh.sampling_params import SamplingParams
from tests.oracle import HFReference, mixed_prompts


@pytest.fixture(scope="module")
def pair(llama_dir: Path) -> tuple[LLMEngine, LLMEngine]:
    make = lambda: LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=128)  # noqa: E731
    return make(), make()


def _prefill(engine: LLMEngine, rid: str, prompt: list[int]) -> int:
    engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=1, output_kind="final_only"),
                       hold_kv=True)
    first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            first = out.outputs[0].token_ids[0]
    return int(first)  # type: ignore[arg-type]


def test_reserve_copy_commit_decode_matches_transformers(pair, hf_refs) -> None:  # type: ignore[no-untyped-def]
    prefill, decode = pair
    ref: HFReference = hf_refs["llama"]
    for i, prompt in enumerate(mixed_prompts(4, seed=5)[1:]):
        rid = f"h{i}"
        params = SamplingParams(temperature=0, max_tokens=8, output_kind="final_only")
        res = decode.handoff.reserve(rid, prompt, params)
        assert decode.first_seq(rid).status is SeqStatus.WAITING_FOR_REMOTE_KV
        assert decode.handoff.count == 1 and decode.orphan_blocks() == 0
        first = _prefill(prefill, rid, prompt)
        seq = prefill.first_seq(rid)
        assert seq.status is SeqStatus.FINISHED_KV_HELD and seq.finish_reason == "length"
        src = prefill.handoff.held_block_ids(rid)[res.first_block :]
        decode.runner.kv_cache[res.block_ids] = prefill.runner.kv_cache[src]  # what NIXL does
        assert prefill.handoff.release(rid) and prefill.stats().used == 0
        decode.handoff.commit(rid, first, None, res.cached_tokens)
        assert decode.first_seq(rid).status is SeqStatus.RUNNING
        out = None
        while decode.has_unfinished_requests():
            out = next((o for o in decode.step() if o.finished), out)
        assert out is not None and out.outputs[0].token_ids == ref.greedy(prompt, 8)
        assert decode.stats().used == 0 and decode.handoff.count == 0


def test_release_frees_a_reservation_and_commit_then_fails(pair) -> None:  # type: ignore[no-untyped-def]
    _, decode = pair
    decode.handoff.reserve("gone", list(range(5, 60)), SamplingParams(max_tokens=4))
    assert decode.stats().used > 0
    assert decode.handoff.release("gone") and decode.stats().used == 0
    assert not decode.handoff.release("gone")
    with pytest.raises(UnknownRequestError):
        decode.handoff.commit("gone", 1, None, 0)


def test_abort_of_a_reservation_frees_it(pair) -> None:  # type: ignore[no-untyped-def]
    _, decode = pair
    decode.handoff.reserve("ab", list(range(5, 40)), SamplingParams(max_tokens=4))
    decode.abort_request("ab")
    assert decode.stats().used == 0 and decode.handoff.count == 0 and decode.orphan_blocks() == 0


def test_reservations_of_one_prefix_made_together_end_up_sharing_its_blocks(pair, hf_refs) -> None:  # type: ignore[no-untyped-def]
    # A burst reserves a shared prefix before any of it has landed, so each reservation
    # gets its own copy; once each commits, its copy of a block the cache already holds
    # is swapped for the cached one and freed: one copy in memory, read once by decode
    # attention, and the tokens unchanged.
    prefill, decode = pair
    ref: HFReference = hf_refs["llama"]
    shared = list(range(7, 7 + 48))  # 3 full blocks of 16
    prompts = {f"d{i}": shared + [100 + i, 200 + i, 300 + i] for i in range(3)}
    params = SamplingParams(temperature=0, max_tokens=6, output_kind="final_only")
    held = {rid: decode.handoff.reserve(rid, p, params) for rid, p in prompts.items()}
    assert all(res.first_block == 0 for res in held.values())  # nothing cached yet
    used_reserved = decode.stats().used
    for rid, prompt in prompts.items():
        first = _prefill(prefill, rid, prompt)
        src = prefill.handoff.held_block_ids(rid)
        decode.runner.kv_cache[held[rid].block_ids] = prefill.runner.kv_cache[src]
        assert prefill.handoff.release(rid)
        decode.handoff.commit(rid, first, None, 0)
    tables = [decode.block_ids_of(rid) for rid in prompts]
    assert tables[0][:3] == tables[1][:3] == tables[2][:3]  # the prefix: one copy
    assert len({t[3] for t in tables}) == 3  # each tail its own
    assert decode.stats().used == used_reserved - 2 * 3
    outs = {}
    while decode.has_unfinished_requests():
        outs.update({o.request_id: o for o in decode.step() if o.finished})
    for rid, prompt in prompts.items():
        assert outs[rid].outputs[0].token_ids == ref.greedy(prompt, 6)
    assert decode.stats().used == 0 and decode.orphan_blocks() == 0

