"""The engine against transformers on the same weights (float32): the oracle."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from pdmesh import LLM, SamplingParams
from tests.oracle import ARCHS, HFReference, mixed_prompts

MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def expected(hf_refs: dict[str, HFReference]):  # type: ignore[no-untyped-def]
    @cache
    def run(arch: str, prompts: tuple[tuple[int, ...], ...]) -> list[list[int]]:
        return [hf_refs[arch].greedy(list(p), MAX_NEW) for p in prompts]

    return run


def check(llm: LLM, prompts: list[list[int]], want: list[list[int]]) -> None:
    outs = llm.generate(prompts, GREEDY)
    got = [o.outputs[0].token_ids for o in outs]
    mismatches = [(len(p), w, g) for p, w, g in zip(prompts, want, got) if w != g]
    assert not mismatches, f"{len(mismatches)}/{len(prompts)} differ: {mismatches[:2]}"
    s = llm.engine.stats()
    assert s.used == 0 and s.free + s.cached == s.num_blocks


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers_concurrently(arch, backend, model_dirs, expected) -> None:  # type: ignore[no-untyped-def]
    # Both CPU attention backends: the fused kernels ("auto" picks them) and the reference.
    prompts = mixed_prompts(10, seed=1)
    llm = LLM(str(model_dirs[arch]), dtype="float32", num_blocks=512, attention_backend=backend)
    assert type(llm.engine.runner.backend).__name__ == {"cpu": "CPUAttentionBackend",
                                                        "torch": "TorchAttentionBackend"}[backend]
    check(llm, prompts, expected(arch, tuple(map(tuple, prompts))))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_with_small_prefill_chunks(arch, model_dirs, expected) -> None:  # type: ignore[no-untyped-def]
    prompts = mixed_prompts(10, seed=1)
    llm = LLM(str(model_dirs[arch]), dtype="float32", num_blocks=512,
              max_num_batched_tokens=24, long_prefill_token_threshold=8)
    check(llm, prompts, expected(arch, tuple(map(tuple, prompts))))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_with_shared_prefix_cache_hits(arch, model_dirs, expected) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(2)
    prefix = [rng.randrange(5, 1000) for _ in range(90)]
    prompts = mixed_prompts(10, seed=3)
    prompts = [prefix + p if i % 2 == 0 else p for i, p in enumerate(prompts)]
    llm = LLM(str(model_dirs[arch]), dtype="float32", num_blocks=512, max_num_batched_tokens=128)
    outs = llm.generate(prompts, GREEDY)
    want = expected(arch, tuple(map(tuple, prompts)))
    assert [o.outputs[0].token_ids for o in outs] == want
    cached = [o.metrics.num_cached_tokens for o in outs]
    # Every prompt after the first with the shared prefix reuses its 5 full blocks (80 tokens).
    assert sorted(cached[0::2]) == [0, 80, 80, 80, 80]
    s = llm.engine.stats()
    assert s.used == 0 and s.cached > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_under_preemption(arch, model_dirs, expected) -> None:  # type: ignore[no-untyped-def]
    prompts = mixed_prompts(10, seed=1)
    llm = LLM(str(model_dirs[arch]), dtype="float32", num_blocks=48, block_size=4)
    check(llm, prompts, expected(arch, tuple(map(tuple, prompts))))
    assert llm.engine.scheduler.num_preemptions > 0


def test_logprobs_match_transformers(llama_dir: Path, hf_refs: dict[str, HFReference]) -> None:
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=256)
    prompts = mixed_prompts(4, seed=5)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, logprobs=5))
    for prompt, out in zip(prompts, outs):
        comp = out.outputs[0]
        ref = hf_refs["llama"].logprobs(prompt + comp.token_ids)
        for i, (tok, lp) in enumerate(zip(comp.token_ids, comp.logprobs or [])):
            row = ref[len(prompt) - 1 + i]
            assert lp.token_id == tok and abs(lp.logprob - float(row[tok])) < 1e-4
            ref_top = row.topk(5)
            assert [t for t, _ in lp.top] == ref_top.indices.tolist()
            assert all(abs(v - float(r)) < 1e-4 for (_, v), r in zip(lp.top, ref_top.values))


def test_n_completions_share_the_prompt_and_free_everything(llama_dir: Path, expected) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=256)
    prompt = mixed_prompts(8, seed=1)[6]  # 48 tokens: three full blocks
    prompt = prompt[:45]  # a partial last block, so siblings copy it on write
    want = expected("llama", (tuple(prompt),))[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW, n=3))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(c.token_ids == want for c in out.outputs)
    sampled = llm.generate([prompt], SamplingParams(temperature=1.0, seed=3, max_tokens=12, n=4))[0]
    assert len({tuple(c.token_ids) for c in sampled.outputs}) > 1
    s = llm.engine.stats()
    assert s.used == 0 and s.free + s.cached == s.num_blocks


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llama_dir: Path) -> None:
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=512)
    target = mixed_prompts(3, seed=9)[2]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=20)
    alone = llm.generate([target], params)[0].outputs[0].token_ids
    others = mixed_prompts(9, seed=10)
    batch = others[:4] + [target] + others[4:]
    mixed = [SamplingParams(temperature=1.0, max_tokens=20)] * 4 + [params] + [
        SamplingParams(temperature=0.5, seed=i, max_tokens=20) for i in range(5)
    ]
    in_batch = llm.generate(batch, mixed)[4].outputs[0].token_ids
    assert in_batch == alone
