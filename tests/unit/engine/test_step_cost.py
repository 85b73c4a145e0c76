"""What a worker advertises for routing: prompt work still queued (less what waiting
prompts will find cached) and the measured cost of a prompt token."""

from __future__ import annotations

from pathlib import Path

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.step_cost import TokenCost
from pdmesh.sampling_params import SamplingParams


def test_queued_prompt_tokens_leave_out_cached_prefixes_and_costs_are_measured(llama_dir: Path) -> None:
    engine = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=64, block_size=16)
    prefix = list(range(10, 138))  # 128 tokens: 8 blocks
    engine.add_request("warm", prefix + [500, 501], SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.pending_prompt_tokens == 0
    assert engine.prefill_cost.s_per_token > 0  # a 130-token prefill step was measured
    engine.add_request("hit", prefix + [600] * 20, SamplingParams(max_tokens=1))  # 148: 128 cached
    engine.add_request("miss", [700] * 100, SamplingParams(max_tokens=1))
    assert engine.scheduler.pending_prompt_tokens == 20 + 100
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.pending_prompt_tokens == 0


def test_token_cost_ignores_small_samples_and_averages() -> None:
    cost = TokenCost(min_tokens=64, weight=0.5)
    cost.observe(10, 1.0)
    assert cost.s_per_token == 0.0
    cost.observe(100, 0.1)
    cost.observe(100, 0.3)
    assert abs(cost.s_per_token - 0.002) < 1e-12


def test_only_steps_that_are_mostly_prompt_price_a_prompt_token() -> None:
    cost = TokenCost(min_tokens=64)
    cost.observe_step(100, 200, 0.5)  # half decode rows: not a prompt's price
    cost.observe_step(0, 0, 0.5)
    assert cost.observed == 0
    cost.observe_step(180, 200, 0.36)  # 90% prompt: counted
    assert cost.observed == 1 and abs(cost.s_per_token - 0.002) < 1e-12
