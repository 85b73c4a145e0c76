"""The engine on a CUDA device (torch attention backend): exact against transformers there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdmesh import LLM, SamplingParams
from tests.oracle import mixed_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible)"),
]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_on_cuda_matches_transformers_on_cuda(model_dirs, arch: str) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    path: Path = model_dirs[arch]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    prompts = mixed_prompts(10, seed=1)
    want = [
        hf.generate(torch.tensor([p], device="cuda"), do_sample=False, max_new_tokens=16)[0, len(p):].tolist()
        for p in prompts
    ]
    llm = LLM(str(path), dtype="float32", device="cuda", num_blocks=512)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    assert [o.outputs[0].token_ids for o in outs] == want
    s = llm.engine.stats()
    assert s.used == 0 and s.free + s.cached == s.num_blocks


def test_sampling_and_penalties_run_on_cuda(llama_dir: Path) -> None:
    llm = LLM(str(llama_dir), dtype="bfloat16", device="cuda", num_blocks=256)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.01, seed=5,
                            repetition_penalty=1.1, presence_penalty=0.2, max_tokens=12, logprobs=3)
    a = llm.generate(mixed_prompts(4, seed=2), params)
    b = llm.generate(mixed_prompts(4, seed=2), params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(len(o.outputs[0].logprobs or []) == 12 for o in a)
