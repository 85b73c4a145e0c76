"""Prompt logprobs in the engine: chunked prefill computes every prompt position's
log-softmax, equal to transformers' (1e-4, float32); a prompt in the prefix cache is
computed again for them; the top-N and ranks are those of the reference."""

from __future__ import annotations

from pathlib import Path

from pdmesh import LLM, SamplingParams
from tests.oracle import HFReference, mixed_prompts


def test_prompt_logprobs_over_chunks_equal_transformers_and_skip_the_prefix_cache(
        llama_dir: Path, hf_refs: dict[str, HFReference]) -> None:
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=256, max_num_batched_tokens=32)
    prompts = [p for p in mixed_prompts(8, seed=21) if len(p) > 1] + [list(range(30, 130))]
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    for round_ in range(2):
        outs = llm.generate(prompts, params)
        for prompt, out in zip(prompts, outs):
            want = hf_refs["llama"].logprobs(prompt)
            got = out.prompt_logprobs or []
            assert [lp.token_id for lp in got] == prompt[1:]
            for i, lp in enumerate(got):
                assert abs(lp.logprob - float(want[i, prompt[i + 1]])) < 1e-4
                assert [t for t, _ in lp.top] == want[i].topk(3).indices.tolist()
                assert lp.rank == int((want[i] > want[i, prompt[i + 1]]).sum()) + 1
            if round_:  # cached from the first round, and computed again
                assert out.metrics.num_cached_tokens == 0
    plain = llm.generate(prompts[-1:], SamplingParams(max_tokens=2, temperature=0))[0]
    assert plain.prompt_logprobs is None and plain.metrics.num_cached_tokens > 0
    assert llm.engine.stats().used == 0
