"""A worker's warm-up: one prompt of the step budget computed before traffic, leaving no
trace a request, the router or the index could see."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdmesh.config import CacheConfig, EngineConfig, SchedulerConfig
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.warm_up import warm_up, warm_up_tokens
from pdmesh.sampling_params import SamplingParams
from tests.oracle import HFReference


def _engine(llama_dir: Path, num_blocks: int = 128, budget: int = 96) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(llama_dir), dtype="float32",
                                  cache=CacheConfig(block_size=4, num_blocks=num_blocks),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=budget)))


def test_warm_up_runs_the_step_budget_and_leaves_nothing_behind(llama_dir: Path) -> None:
    engine = _engine(llama_dir)
    engine.pool.take_events()
    done = warm_up(engine)
    assert done is not None and done.prompt_tokens == 96 and done.seconds > 0
    stats = engine.pool.stats()
    assert stats.used == 0 and stats.cached == 0 and engine.orphan_blocks() == 0
    assert engine.pool.take_events() == []  # nothing for the index publisher
    assert engine.prefill_cost.observed == 0  # a cold step does not price the worker's tokens
    assert engine.pool.enable_caching and not engine.has_unfinished_requests()


def test_a_warmed_engine_still_matches_transformers(llama_dir: Path) -> None:
    engine = _engine(llama_dir)
    warm_up(engine)
    prompt = list(range(5, 45))
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = list(out.outputs[0].token_ids)
    assert tokens == HFReference(llama_dir).greedy(prompt, 8)


def test_the_warm_up_fits_the_pool_and_the_context(llama_dir: Path) -> None:
    small = _engine(llama_dir, num_blocks=8, budget=2048)
    assert warm_up_tokens(small, -1) == (8 - 1) * 4 - 2
    assert warm_up_tokens(small, 10) == 10
    assert warm_up_tokens(small, 0) == 0 and warm_up(small, 0) is None
    assert warm_up_tokens(_engine(llama_dir, num_blocks=4096, budget=10**6), -1) == small.max_model_len - 2
    done = warm_up(small)
    assert done is not None and small.pool.stats().used == 0


def test_warm_up_refuses_an_engine_with_requests(llama_dir: Path) -> None:
    engine = _engine(llama_dir)
    engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2))
    with pytest.raises(RuntimeError, match="before the engine takes requests"):
        warm_up(engine)
