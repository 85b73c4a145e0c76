"""The mesh on a CUDA device: KV pools in GPU memory, blocks moved VRAM to VRAM by NIXL.

The CPU mesh tests prove routing, faults and leaks over DRAM pools; these prove the one
transfer path the design promises also carries GPU memory (UCX picks its CUDA transports
for VRAM descriptors), with greedy tokens exact against transformers on the same device.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from tests.integration.mesh_tools import infos, wait_idle
from tests.oracle import mixed_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible)"),
]

MAX_NEW = 16


@pytest.fixture(scope="module")
def cuda_mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=1,
                    worker_args=["--device", "cuda", "--dtype", "float32", "--num-blocks", "256",
                                 "--block-size", "16"],
                    prefill_args=["--max-num-batched-tokens", "64"],
                    log_dir=str(tmp_path_factory.mktemp("cuda-mesh-logs")))
    with Mesh(spec) as m:
        yield m


@pytest.fixture(scope="module")
def hf_cuda(llama_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).cuda().eval()


def greedy_on_cuda(hf, prompt: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    ids = torch.tensor([prompt], device="cuda")
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
    return out[0, len(prompt):].tolist()


def test_workers_register_their_kv_pools_in_gpu_memory(cuda_mesh: Mesh) -> None:
    state = infos(cuda_mesh)
    assert {n: i.kv_mem_type for n, i in state.items()} == {"prefill-0": "VRAM", "decode-0": "VRAM"}


def test_greedy_across_a_cuda_mesh_matches_transformers_on_cuda(cuda_mesh: Mesh, hf_cuda) -> None:  # type: ignore[no-untyped-def]
    sent0 = infos(cuda_mesh)["prefill-0"].kv_bytes_sent
    prompts = mixed_prompts(12, seed=7)
    with Client(cuda_mesh.router_address, timeout=120) as client, ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(lambda p: client.complete(p, max_tokens=MAX_NEW, temperature=0), prompts))
    assert [o.token_ids for o in outs] == [greedy_on_cuda(hf_cuda, p) for p in prompts]
    state = wait_idle(cuda_mesh)
    assert state["prefill-0"].kv_bytes_sent > sent0
    assert all(i.used_blocks == 0 for i in state.values())


def test_a_second_turn_moves_only_its_new_blocks_between_gpu_pools(cuda_mesh: Mesh, hf_cuda) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    turn1 = [rng.randrange(5, 1000) for _ in range(70)]
    with Client(cuda_mesh.router_address, timeout=120) as client:
        out1 = client.complete(turn1, max_tokens=10, temperature=0, ignore_eos=True)
        sent0 = infos(cuda_mesh)["prefill-0"].kv_bytes_sent
        turn2 = turn1 + out1.token_ids + [rng.randrange(5, 1000) for _ in range(40)]
        out2 = client.complete(turn2, max_tokens=MAX_NEW, temperature=0)
    state = wait_idle(cuda_mesh)
    moved = state["prefill-0"].kv_bytes_sent - sent0
    total_blocks = -(-len(turn2) // 16)
    assert out2.token_ids == greedy_on_cuda(hf_cuda, turn2)
    assert out2.cached_tokens >= 64
    assert moved == (total_blocks - 4) * state["decode-0"].kv_block_bytes


def test_an_evicted_prefix_comes_back_from_the_kvstore_into_gpu_memory(cuda_mesh: Mesh, hf_cuda) -> None:  # type: ignore[no-untyped-def]
    """VRAM to the kvstore's DRAM on offload, DRAM to VRAM on the fetch: mixed memory types."""
    rng = random.Random(81)
    prefix = [rng.randrange(5, 1000) for _ in range(128)]  # 8 full blocks
    with Client(cuda_mesh.router_address, timeout=120) as client:
        client.complete(prefix + [11, 12, 13], max_tokens=2, temperature=0)
        deadline = time.monotonic() + 10  # offload runs after the response
        while infos(cuda_mesh)["prefill-0"].kvstore_offloaded_blocks < 8:
            assert time.monotonic() < deadline, "the prefix never reached the kvstore"
            time.sleep(0.1)
        # 800 blocks of other prompts, ~3x the prefill worker's 256: the prefix is evicted there.
        fillers = [[rng.randrange(5, 1000) for _ in range(150)] for _ in range(80)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: client.complete(p, max_tokens=1, temperature=0), fillers))
        before = infos(cuda_mesh)["prefill-0"]
        prompt = prefix + [21, 22, 23]
        out = client.complete(prompt, max_tokens=MAX_NEW, temperature=0)
    after = infos(cuda_mesh)["prefill-0"]
    assert after.kvstore_fetched_tokens - before.kvstore_fetched_tokens == 128
    assert after.computed_prompt_tokens - before.computed_prompt_tokens == 3
    assert out.token_ids == greedy_on_cuda(hf_cuda, prompt)
    assert all(i.used_blocks == 0 for i in wait_idle(cuda_mesh).values())


def test_cancelled_requests_leave_no_gpu_block_held(cuda_mesh: Mesh) -> None:
    prompts = mixed_prompts(24, seed=9)
    with Client(cuda_mesh.router_address, timeout=120) as client, ThreadPoolExecutor(24) as pool:
        def cut_short(i: int) -> int:
            stream = client._stub.Generate(
                client.request(prompts[i], request_id=f"gpu-cancel-{i}", max_tokens=64,
                               temperature=0, ignore_eos=True), timeout=60)
            for n, _ in enumerate(stream):
                if n >= i % 4:
                    stream.cancel()
                    return n + 1
            return 0

        assert all(n >= 1 for n in pool.map(cut_short, range(len(prompts))))
    state = wait_idle(cuda_mesh, timeout=8)
    for name, info in state.items():
        assert info.used_blocks == 0 and info.num_handoffs == 0, name
