"""The whole mesh: real processes, real redis-server, real NIXL transfers on 127.0.0.1."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import admin, infos, kvstore_lookups, wait_idle
from tests.oracle import HFReference, mixed_prompts

MAX_NEW = 16


def test_greedy_through_the_mesh_matches_transformers(mesh: Mesh, client: Client, hf_refs) -> None:  # type: ignore[no-untyped-def]
    ref: HFReference = hf_refs["llama"]
    prompts = mixed_prompts(16, seed=11)
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda p: client.complete(p, max_tokens=MAX_NEW, temperature=0), prompts))
    want = [ref.greedy(p, MAX_NEW) for p in prompts]
    assert [o.token_ids for o in outs] == want
    assert all(o.finish_reason in ("length", "stop") for o in outs)
    assert all(o.prompt_tokens == len(p) for o, p in zip(outs, prompts))
    state = wait_idle(mesh)
    assert sum(i.kv_bytes_sent for n, i in state.items() if n.startswith("prefill")) > 0


def test_text_prompts_and_streaming(client: Client) -> None:
    chunks = list(client.generate("def main():", max_tokens=8, temperature=0))
    assert chunks[-1].finish_reason and chunks[-1].usage.completion_tokens == 8
    assert sum(len(c.token_ids) for c in chunks) == 8
    assert client.tokenize("def main():")[0] == 0  # BOS


def test_shared_prefix_lands_on_the_worker_that_holds_it(mesh: Mesh, client: Client) -> None:
    rng = random.Random(21)
    prefix = [rng.randrange(5, 1000) for _ in range(96)]  # 6 full blocks
    first = client.complete(prefix + [7, 8, 9], max_tokens=2, temperature=0)
    assert first.cached_tokens == 0
    before = infos(mesh)
    time.sleep(0.3)  # the publisher pushes events every 20 ms
    outs = [client.complete(prefix + [rng.randrange(5, 1000) for _ in range(5)], max_tokens=2,
                            temperature=0) for _ in range(4)]
    after = infos(mesh)
    assert all(o.cached_tokens >= 96 for o in outs)
    gained = {n: after[n].cached_prompt_tokens - before[n].cached_prompt_tokens
              for n in after if n.startswith("prefill")}
    # Every follow-up hit one prefill worker's cache: 4 x 96 cached tokens there, none elsewhere.
    assert sorted(gained.values()) == [0, 4 * 96]
    stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
    assert stats.decisions["cache_aware/hit"] >= 4


def test_second_turn_moves_only_the_new_blocks(mesh: Mesh, client: Client) -> None:
    rng = random.Random(31)
    turn1 = [rng.randrange(5, 1000) for _ in range(70)]
    out1 = client.complete(turn1, max_tokens=10, temperature=0, ignore_eos=True)
    sent0 = sum(i.kv_bytes_sent for i in infos(mesh).values())
    turn2 = turn1 + out1.token_ids + [rng.randrange(5, 1000) for _ in range(40)]
    out2 = client.complete(turn2, max_tokens=4, temperature=0)
    moved = sum(i.kv_bytes_sent for i in infos(mesh).values()) - sent0
    block_bytes = infos(mesh)["decode-0"].kv_block_bytes
    # D computed KV for turn 1's 79 tokens (the last sampled token never ran through the
    # model): 4 full blocks stay cached there and only the rest of turn 2 moves.
    total_blocks = -(-len(turn2) // 16)
    assert out2.cached_tokens >= 64
    assert moved == (total_blocks - 4) * block_bytes < total_blocks * block_bytes


def test_bad_requests_get_precise_statuses(client: Client) -> None:
    cases = [
        (dict(prompt=[5, 10**6]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
        (dict(prompt="hi", top_p=3.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        (dict(prompt="hi", max_tokens=10**6), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        (dict(prompt=[]), grpc.StatusCode.INVALID_ARGUMENT, "token_ids"),
        (dict(prompt="hi", request_id="r" * 300), grpc.StatusCode.INVALID_ARGUMENT, "at most 256"),
        (dict(prompt="hi", stop=["x" * 600]), grpc.StatusCode.INVALID_ARGUMENT, "at most 512"),
    ]
    for kwargs, code, needle in cases:
        with pytest.raises(grpc.RpcError) as err:
            client.complete(**kwargs)
        assert err.value.code() == code and needle in err.value.details()


def test_deadline_is_reported(client: Client) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.complete([5] * 50, max_tokens=500, ignore_eos=True, timeout=0.05)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_fresh_prompt_skips_the_kvstore_lookup_the_index_answered(mesh: Mesh, client: Client) -> None:
    """The router's index lookup lists what the kvstore publishes: nothing of a fresh
    prompt, so the prefill worker computes it without asking the store first."""
    rng = random.Random(83)
    before = kvstore_lookups(mesh)
    for _ in range(3):
        client.complete([rng.randrange(5, 1000) for _ in range(100)], max_tokens=1, temperature=0)
    after = kvstore_lookups(mesh)
    assert (after["asked"] - before["asked"], after["skipped"] - before["skipped"]) == (0, 3)


def test_blocks_travel_while_later_chunks_compute(mesh: Mesh, client: Client, hf_refs) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(91)
    # 15 chunks of 64 on the prefill worker: long enough that the reservation (sent while
    # the prompt computes) and the first write to a new peer land well before the last
    # chunk; at 300 tokens (5 chunks, ~25 ms) a loaded CI machine once sent nothing early.
    prompt = [rng.randrange(5, 1000) for _ in range(952)]  # the last block partial: sent last
    before = infos(mesh)
    out = client.complete(prompt, max_tokens=6, temperature=0)
    after = infos(mesh)
    assert out.token_ids == hf_refs["llama"].greedy(prompt, 6)
    early = sum(after[n].overlapped_blocks - before[n].overlapped_blocks for n in after)
    sent = sum(after[n].kv_bytes_sent - before[n].kv_bytes_sent for n in after)
    block_bytes = after["decode-0"].kv_block_bytes
    assert sent == 60 * block_bytes  # ceil(952 / 16) blocks, each sent once
    # Blocks went before the prompt was done (at least the first chunk's four), but not all
    # of them. How many depends on a write's time against a chunk's: with 64-token chunks
    # down to ~5 ms since the prefill attention fix, and the first write to a new peer
    # ~20 ms (UCX connects on first use), 4-8 went early where 12-16 used to.
    assert 4 <= early < 60


def test_grpc_n_priority_stop_string_and_detokenize(client: Client) -> None:
    outs = client.complete_n("import os\n", n=2, max_tokens=8, temperature=0.8, seed=3, priority=1)
    assert len(outs) == 2 and all(len(o.token_ids) == 8 or o.finish_reason == "stop" for o in outs)
    again = client.complete_n("import os\n", n=2, max_tokens=8, temperature=0.8, seed=3)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]  # completion i: seed + i
    full = client.complete("import os\n", max_tokens=10, temperature=0)
    word = full.text.strip().split()[0]
    kept = client.complete("import os\n", max_tokens=10, temperature=0, stop=[word],
                           include_stop_str_in_output=True)
    assert kept.finish_reason == "stop" and kept.text.endswith(word)
    ids = client.tokenize("def main():")
    assert client.detokenize(ids, skip_special_tokens=True) == "def main():"


def test_first_token_streamed_from_prefill_matches_the_decode_workers_rendering(
        mesh: Mesh, client: Client) -> None:
    """The router streams the first token from the prefill worker's answer unless stop
    strings are set (a stop string that never occurs takes the old path: the decode
    worker's rendering). Both paths must give the same tokens, text, logprobs, finish and
    usage, with the first token once; a request that its first token ends (max_tokens 1, a
    stop token) needs no Decode call and leaves no reservation behind."""
    prompt = "def main():\n    print("

    def stream(**kw):  # type: ignore[no-untyped-def]
        chunks = list(client.generate(prompt, temperature=0, logprobs=2, **kw))
        last = chunks[-1]
        return (chunks, [t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks),
                [(lp.token_id, round(lp.logprob, 4)) for c in chunks for lp in c.logprobs],
                (last.finish_reason, last.stop_reason, last.usage.prompt_tokens,
                 last.usage.completion_tokens, last.usage.cached_tokens))

    first = stream(max_tokens=1)[1][0]
    for kw in (dict(max_tokens=12), dict(max_tokens=1), dict(max_tokens=12, stop_token_ids=[first])):
        early = stream(**kw)
        late = stream(stop=["\x00never"], **kw)
        assert early[1:] == late[1:], kw
        assert len(early[0][0].token_ids) == 1 and early[1][0] == first
        assert [t for t, _ in early[3]] == early[1]
    assert early[4][:2] == (1, str(first))  # FINISH_REASON_STOP on the stop token
    wait_idle(mesh, timeout=8)  # sooner than the reservations' 10 s lease


def test_every_worker_warmed_up_before_serving(mesh: Mesh) -> None:
    # The prefill workers' step budget is 64 tokens; the decode worker's is the default
    # 2,048, cut to 2,046 by the tiny model's 2,048-token context (room for the decode step).
    for proc, tokens in [*((p, 64) for p in mesh.prefill), *((d, 2046) for d in mesh.decode)]:
        assert proc.log is not None
        assert f"warmed up: a {tokens}-token prompt and a decode step" in proc.log.read_text(), proc.name
