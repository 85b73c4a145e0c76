"""Speculative decoding in the engine: exact greedy output, the target's distribution when
sampling, reproducible seeds, and no block left behind in either KV pool."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pdmesh import LLM, SamplingParams
from pdmesh.engine.llm_engine import LLMEngine
from tests.oracle import HFReference, mixed_prompts

MAX_NEW = 24


@pytest.fixture(scope="module")
def draft_dir(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with noise on its weights: the same tokenizer, a draft that is right
    often but not always, so acceptance, rejection and KV roll-back all happen."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("draft") / "llama"
    shutil.copytree(llama_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    noisy = {k: w + 0.5 * w.std() * torch.randn(w.shape, generator=gen) if w.dim() == 2 else w
             for k, w in weights.items()}
    save_file(noisy, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def prompts_for_spec() -> list[list[int]]:
    rng = random.Random(5)
    prefix = [rng.randrange(5, 1000) for _ in range(40)]
    loops = [[11, 12, 13, 14, 15] * 8, list(range(100, 130)) * 3]  # n-gram lookup hits here
    mixed = mixed_prompts(8, seed=1)
    return loops + [prefix + p if i % 3 == 0 else p for i, p in enumerate(mixed)]


@pytest.fixture(scope="module")
def expected(hf_refs: dict[str, HFReference]) -> list[list[int]]:
    return [hf_refs["llama"].greedy(p, MAX_NEW) for p in prompts_for_spec()]


def spec(method: str, k: int, draft: Path | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": k, "disable_by_batch_size": 64}
    if draft is not None:
        cfg["model"] = str(draft)
    return cfg


def assert_no_block_in_use(engine: LLMEngine) -> None:
    s = engine.stats()
    assert s.used == 0 and s.free + s.cached == s.num_blocks
    assert engine.kv.num_sequences() == 0
    draft_stats = getattr(engine.speculator.proposer, "stats", None)
    if draft_stats is not None:
        assert draft_stats().used == 0


CASES = [("ngram", 1, None), ("ngram", 3, None), ("ngram", 5, None),
         ("draft_model", 1, "other"), ("draft_model", 3, "other"), ("draft_model", 5, "same")]


@pytest.mark.parametrize(("method", "k", "which"), CASES)
def test_greedy_with_speculation_equals_transformers(
    method: str, k: int, which: str | None, llama_dir: Path, draft_dir: Path, expected: list[list[int]]
) -> None:
    # Chunked prefill (8-token chunks), shared-prefix cache hits and a pool small enough to
    # preempt all happen while drafts are verified.
    draft = {"other": draft_dir, "same": llama_dir, None: None}[which]
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=72, block_size=4,
              max_num_batched_tokens=48, long_prefill_token_threshold=8,
              speculative_config=spec(method, k, draft))
    outs = llm.generate(prompts_for_spec(), SamplingParams(temperature=0, max_tokens=MAX_NEW))
    got = [o.outputs[0].token_ids for o in outs]
    assert got == expected
    accepted = sum(o.metrics.spec_accepted_tokens for o in outs)
    drafted = sum(o.metrics.spec_draft_tokens for o in outs)
    assert drafted > 0 and accepted > 0, "speculation never ran: the test would prove nothing"
    if which == "same":
        assert accepted == drafted  # the target drafting for itself is always right
    assert llm.engine.scheduler.num_preemptions > 0
    assert sum(o.metrics.num_cached_tokens for o in outs) > 0
    assert_no_block_in_use(llm.engine)


@pytest.mark.parametrize(("method", "which"), [("ngram", None), ("draft_model", "other")])
def test_aborts_mid_speculation_leave_no_block(method: str, which: str | None, llama_dir: Path,
                                               draft_dir: Path) -> None:
    engine = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=96, block_size=4,
                                  speculative_config=spec(method, 3, draft_dir if which else None))
    rng = random.Random(0)
    prompts = prompts_for_spec() * 3
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    live = {f"r{i}" for i in range(len(prompts))}
    drafted = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            drafted += out.metrics.spec_draft_tokens
            if out.finished:
                live.discard(out.request_id)
        for rid in [r for r in sorted(live) if rng.random() < 0.05]:
            engine.abort_request(rid)
            live.discard(rid)
    assert drafted > 0
    assert_no_block_in_use(engine)


def test_stop_strings_and_max_tokens_cut_an_accepted_run(llama_dir: Path) -> None:
    base = LLM(str(llama_dir), dtype="float32", num_blocks=256)
    fast = LLM(str(llama_dir), dtype="float32", num_blocks=256, speculative_config=spec("ngram", 5))
    loop = [[11, 12, 13, 14, 15] * 8]
    free_run = base.generate(loop, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    text = free_run.outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    for params in (SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=(stop,)),
                   SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                  stop_token_ids=(free_run.outputs[0].token_ids[9],))):
        want, got = base.generate(loop, params)[0].outputs[0], fast.generate(loop, params)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    assert_no_block_in_use(fast.engine)


@pytest.mark.parametrize(("method", "which"), [("ngram", None), ("draft_model", "other")])
def test_seeded_sampling_with_speculation_is_reproducible(method: str, which: str | None,
                                                          llama_dir: Path, draft_dir: Path) -> None:
    params = SamplingParams(temperature=0.7, top_k=20, repetition_penalty=1.1, seed=7, max_tokens=30,
                            ignore_eos=True, logprobs=1)
    cfg = spec(method, 3, draft_dir if which else None)
    runs = [LLM(str(llama_dir), dtype="float32", num_blocks=256, speculative_config=cfg)
            .generate(prompts_for_spec(), params) for _ in range(2)]
    assert [o.outputs[0].token_ids for o in runs[0]] == [o.outputs[0].token_ids for o in runs[1]]
    assert all(len(o.outputs[0].logprobs or []) == 30 for o in runs[0])


def test_sampling_with_a_wrong_draft_keeps_the_targets_distribution(llama_dir: Path, draft_dir: Path) -> None:
    """Two-sample chi-square over the joint of the first three sampled tokens: with a draft
    that is mostly wrong (so rejection and residual sampling run), the tokens come from the
    same distribution as without speculation."""
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=s) for s in range(1500)]
    prompt = [[11, 12, 13, 14, 15] * 4]
    counts = []
    for cfg in (None, spec("draft_model", 2, draft_dir)):
        llm = LLM(str(llama_dir), dtype="float32", num_blocks=2048, max_num_seqs=256, speculative_config=cfg)
        outs = llm.generate(prompt * len(params), params)
        counts.append(Counter(tuple(o.outputs[0].token_ids[1:]) for o in outs))
        if cfg is not None:
            assert sum(o.metrics.spec_draft_tokens for o in outs) > 0
            assert sum(o.metrics.spec_accepted_tokens for o in outs) < sum(o.metrics.spec_draft_tokens for o in outs)
    cells = [c for c in set(counts[0]) | set(counts[1]) if counts[0][c] + counts[1][c] >= 10]
    stat = sum((counts[0][c] - counts[1][c]) ** 2 / (counts[0][c] + counts[1][c]) for c in cells)
    # Critical chi-square at significance 0.001 for len(cells) - 1 degrees of freedom
    # (Wilson-Hilferty approximation), cells with fewer than 10 samples left out.
    df = len(cells) - 1
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
    assert df >= 3 and stat < critical, (stat, critical, df)


def test_n_completions_fork_and_speculate(llama_dir: Path, expected: list[list[int]]) -> None:
    # Siblings fork from the first sequence's blocks (copy-on-write), then each verifies
    # its own drafts; with greedy decoding all three must equal transformers.
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=256, block_size=4, speculative_config=spec("ngram", 3))
    prompts = prompts_for_spec()[:2]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, n=3))
    for out, want in zip(outs, expected[:2]):
        assert [c.token_ids for c in out.outputs] == [want] * 3
    assert sum(o.metrics.spec_accepted_tokens for o in outs) > 0
    assert_no_block_in_use(llm.engine)
