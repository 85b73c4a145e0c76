"""DeepSeek-V3 (latent attention: a KV cache of one latent per token, over a mixture of
experts) and a sliding-window model (Gemma 3: local and global layers, a window of 24
tokens that the prompts here pass up to six times over) through a real mesh
(1 prefill + 1 decode worker, the kvstore tier; KV over NIXL): greedy tokens equal
transformers' with prefill in chunks, prefix hits, n > 1, a prefix fetched back from the
kvstore, and decode preempting in a small pool; no block left anywhere after each."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client
from pdmesh.kv.layout import KVLayout
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.model.config import ModelConfig
from pdmesh.telemetry.scrape import scrape, total
from tests.integration.mesh_tools import infos, wait_idle
from tests.oracle import HFReference, mixed_prompts

MAX_NEW = 24


@pytest.fixture(scope="module", params=["deepseek_v3", "gemma3"])
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def family_mesh(arch: str, model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(model_dirs[arch]), prefill=1, decode=1, kvstore=1,
                    worker_args=["--dtype", "float32", "--block-size", "16"],
                    prefill_args=["--num-blocks", "64", "--max-num-batched-tokens", "32"],
                    decode_args=["--num-blocks", "40"], share_cores=False,
                    router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path_factory.mktemp(f"{arch}-mesh")))
    with Mesh(spec) as m:
        yield m


@pytest.fixture(scope="module")
def ref(arch: str, hf_refs: dict[str, HFReference]) -> HFReference:
    return hf_refs[arch]


def _complete_all(mesh: Mesh, prompts: list[list[int]], new: int = MAX_NEW, **sampling: object) -> list[list[int]]:
    """Every prompt's tokens; a request the full decode pool refuses (RESOURCE_EXHAUSTED,
    the retryable status) is sent again after a pause, as a client does."""
    def one(p: list[int]) -> list[int]:
        deadline = time.monotonic() + 120
        with Client(mesh.router_address, timeout=120) as c:
            while True:
                try:
                    return c.complete(p, max_tokens=new, ignore_eos=True, **sampling).token_ids
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:  # type: ignore[attr-defined]
                        raise
                    time.sleep(0.2)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def _greedy(ref: HFReference, prompt: list[int], new: int = MAX_NEW) -> list[int]:
    import torch

    ids = torch.tensor([prompt])
    endless = copy.deepcopy(ref.model.generation_config)
    endless.eos_token_id = None  # EOS is a token like any other, as with ignore_eos
    out = ref.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=endless, do_sample=False,
                             max_new_tokens=new)
    return out[0, len(prompt):].tolist()


NEAR_TIE = 1e-4
"""A divergence passes only where the reference's own log-probs put the two tokens within
this of each other (ours the likelier, or behind by less): 90 tokens of a random-weight
model meet such ties, and transformers' cached generate and its full forward then disagree
with each other too."""


def _tie_aware(ref: HFReference, prompts: list[list[int]], got: list[list[int]],
               want: list[list[int]]) -> list[tuple[int, int, float]]:
    """Each sequence equal to the reference's up to its first divergence, which must be a
    near-tie in the reference's log-probs of the tokens so far; the divergences found."""
    found = []
    for i, (p, g, w) in enumerate(zip(prompts, got, want, strict=True)):
        pos = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), None)
        if pos is None:
            assert len(g) == len(w), i
            continue
        row = ref.logprobs(p + w[:pos])[-1]
        lead = float(row[w[pos]] - row[g[pos]])
        assert lead < NEAR_TIE, f"sequence {i} diverges at {pos}: token {g[pos]}, the reference's {w[pos]} leads by {lead}"
        found.append((i, pos, lead))
    return found


def test_concurrent_greedy_through_the_mesh_with_chunked_prefill(family_mesh: Mesh, ref: HFReference) -> None:
    prompts = mixed_prompts(12, seed=41)  # up to 150 tokens: prefilled 32 at a time, written over NIXL
    assert _complete_all(family_mesh, prompts, temperature=0) == [_greedy(ref, p) for p in prompts]
    state = wait_idle(family_mesh)
    assert state["prefill-0"].kv_bytes_sent > 0


def test_the_handoff_moves_blocks_of_the_models_own_layout(family_mesh: Mesh, arch: str,
                                                            model_dirs: dict[str, Path]) -> None:
    """A fresh 70-token prompt crosses as its 5 blocks, each the size the model's layout
    gives: for DeepSeek-V3 a latent of 40 numbers a token and layer, a quarter of the 160
    that its 4 heads' keys (24 wide) and values (16) would take expanded."""
    cfg = ModelConfig.from_dir(model_dirs[arch])
    layout = KVLayout.for_model(cfg, 16, "float32")
    if arch == "deepseek_v3":
        assert cfg.mla is not None and layout.block_shape == (cfg.num_layers, 1, 16, 1, 40)
        assert cfg.num_heads * (cfg.mla.qk_head_dim + cfg.mla.v_head_dim) == 4 * 40
    before = wait_idle(family_mesh)["prefill-0"]
    assert before.kv_block_bytes == layout.block_bytes
    rng = random.Random(59)
    with Client(family_mesh.router_address, timeout=120) as c:
        c.complete([rng.randrange(5, 1000) for _ in range(70)], max_tokens=2, temperature=0)
    after = wait_idle(family_mesh)["prefill-0"]
    assert after.kv_bytes_sent - before.kv_bytes_sent == 5 * layout.block_bytes


def test_prefix_hits_and_n_completions(family_mesh: Mesh, ref: HFReference) -> None:
    rng = random.Random(43)
    prefix = [rng.randrange(5, 1000) for _ in range(64)]
    prompts = [prefix + [rng.randrange(5, 1000) for _ in range(6)] for _ in range(3)]
    with Client(family_mesh.router_address, timeout=120) as c:
        outs = [c.complete(p, max_tokens=MAX_NEW, temperature=0, ignore_eos=True) for p in prompts]
        forks = c.complete_n(prompts[0], max_tokens=MAX_NEW, temperature=0, ignore_eos=True, n=3)
    assert [o.token_ids for o in outs] == [_greedy(ref, p) for p in prompts]
    assert all(o.cached_tokens >= 64 for o in outs[1:])
    assert [f.token_ids for f in forks] == [outs[0].token_ids] * 3
    wait_idle(family_mesh)


def test_an_evicted_prefix_comes_back_from_the_kvstore(family_mesh: Mesh, ref: HFReference) -> None:
    rng = random.Random(47)
    prefix = [rng.randrange(5, 1000) for _ in range(64)]  # 4 blocks, offloaded after the request
    with Client(family_mesh.router_address, timeout=120) as c:
        c.complete(prefix + [9], max_tokens=2, temperature=0)
        deadline = time.monotonic() + 10
        while infos(family_mesh)["prefill-0"].kvstore_offloaded_blocks < 4:
            assert time.monotonic() < deadline, "the prefix never reached the kvstore"
            time.sleep(0.1)
        for _ in range(12):  # 12 x 6 blocks: past the prefill worker's 64
            c.complete([rng.randrange(5, 1000) for _ in range(90)], max_tokens=1, temperature=0)
        before = infos(family_mesh)["prefill-0"]
        prompt = prefix + [rng.randrange(5, 1000) for _ in range(5)]
        out = c.complete(prompt, max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    after = infos(family_mesh)["prefill-0"]
    assert after.kvstore_fetched_tokens - before.kvstore_fetched_tokens == 64
    assert out.token_ids == _greedy(ref, prompt)
    wait_idle(family_mesh)


def test_decode_preempts_in_a_small_pool_and_still_matches(family_mesh: Mesh, ref: HFReference) -> None:
    """40 decode blocks for 16 streams that take 2 each to start and 7 by their end (any 6
    of them decoding at once outgrow the pool, however the prefills stagger their starts):
    some are preempted and computed again on the decode worker, with the same tokens."""
    rng = random.Random(53)
    prompts = [[rng.randrange(5, 1000) for _ in range(20)] for _ in range(16)]
    before = total(scrape(family_mesh.decode[0].metrics_address), "pdmesh_preemptions_total")
    got = _complete_all(family_mesh, prompts, new=90, temperature=0)
    ties = _tie_aware(ref, prompts, got, [_greedy(ref, p, 90) for p in prompts])
    print(f"preempted streams: {len(ties)} divergences at near-ties (sequence, position, lead): {ties}")
    assert total(scrape(family_mesh.decode[0].metrics_address), "pdmesh_preemptions_total") > before
    wait_idle(family_mesh)
