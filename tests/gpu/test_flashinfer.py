"""The flashinfer backend and CUDA-graph decode on a GPU, against transformers and the torch backend.

flashinfer computes in bf16 (and fp16), so greedy tokens are compared tie-aware
(``near_ties.py``): every divergence must be a near-tie of the reference's logits. The
models are the "small" shape (head_dim 64 for llama and qwen2, 128 for qwen3), sizes
flashinfer's kernels are built for; the exact float32 comparison on CUDA is the torch
backend's (test_cuda_engine.py).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from pdmesh import LLM, SamplingParams
from pdmesh.attention.flashinfer_backend import FlashInferBackend
from tests.gpu.near_ties import compare
from tests.oracle import mixed_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible)"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                       reason="needs flashinfer (pip install 'pdmesh[gpu]')"),
]

ARCHS = ("llama", "qwen2", "qwen3")
NEW = 24
TOP = 20


@pytest.fixture(scope="module")
def small_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from pdmesh.tools.make_tiny import make_tiny

    root = tmp_path_factory.mktemp("gpu-models")
    return {arch: make_tiny(root / arch, arch, "small", seed=0) for arch in ARCHS}


def hf_greedy(path: Path, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[dict[int, float]]]]:
    """transformers' bf16 greedy tokens on CUDA and its top log-probs at each of them."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    tokens, tops = [], []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                          output_scores=True, return_dict_in_generate=True)
        tokens.append(out.sequences[0, len(p):].tolist())
        tops.append([_top(torch.log_softmax(s[0].float(), -1)) for s in out.scores])
    return tokens, tops


def _top(logprobs: torch.Tensor) -> dict[int, float]:
    vals, ids = logprobs.topk(TOP)
    return dict(zip(ids.tolist(), vals.tolist()))


def run(llm: LLM, prompts: list[list[int]], cached: int = 0) -> tuple[list[list[int]], list[list[dict[int, float]]]]:
    """Greedy tokens (past EOS, as transformers' stop at it and the comparison ends there)
    and top log-probs; each request must have hit at least ``cached`` prompt tokens."""
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=TOP))
    assert all(o.metrics.num_cached_tokens >= cached for o in outs)
    comps = [o.outputs[0] for o in outs]
    return [c.token_ids for c in comps], [[dict(lp.top) for lp in c.logprobs or []] for c in comps]


def assert_no_blocks_held(llm: LLM) -> None:
    s = llm.engine.stats()
    assert s.used == 0 and s.free + s.cached == s.num_blocks


@pytest.mark.parametrize("arch", ARCHS)
def test_flashinfer_greedy_matches_transformers_on_cuda(small_dirs: dict[str, Path], arch: str) -> None:
    prompts = mixed_prompts(10, seed=1)
    want, want_top = hf_greedy(small_dirs[arch], prompts)
    llm = LLM(str(small_dirs[arch]), dtype="bfloat16", device="cuda", num_blocks=512)
    assert isinstance(llm.engine.runner.backend, FlashInferBackend)
    got, _ = run(llm, prompts)
    agreement = compare(got, want, want_top)
    print(f"{arch}: {agreement.matched}/{agreement.compared} positions equal, divergences {agreement.divergences}")
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0
    assert_no_blocks_held(llm)


@pytest.mark.parametrize("arch", ARCHS)
def test_flashinfer_greedy_matches_the_torch_backend_on_cuda(small_dirs: dict[str, Path], arch: str) -> None:
    prompts = mixed_prompts(10, seed=2)
    reference = LLM(str(small_dirs[arch]), dtype="bfloat16", device="cuda", num_blocks=512,
                    attention_backend="torch")
    want, want_top = run(reference, prompts)
    llm = LLM(str(small_dirs[arch]), dtype="bfloat16", device="cuda", num_blocks=512,
              attention_backend="flashinfer")
    got, _ = run(llm, prompts)
    agreement = compare(got, want, want_top)
    print(f"{arch}: {agreement.matched}/{agreement.compared} positions equal, divergences {agreement.divergences}")
    assert_no_blocks_held(llm)
    assert_no_blocks_held(reference)


def test_cuda_graphs_on_and_off_agree(small_dirs: dict[str, Path]) -> None:
    prompts = mixed_prompts(20, seed=3)  # 20 rows: the 24-row graph, padded
    eager = LLM(str(small_dirs["llama"]), dtype="bfloat16", device="cuda", num_blocks=512, cuda_graphs=False)
    assert eager.engine.runner.graphs is None
    want, want_top = run(eager, prompts)
    graphs = LLM(str(small_dirs["llama"]), dtype="bfloat16", device="cuda", num_blocks=512, max_num_seqs=32)
    got, _ = run(graphs, prompts)
    runner = graphs.engine.runner
    assert runner.graphs is not None and runner.graphs.batches[-1] == 32 and runner.graphs.replays > NEW // 2
    agreement = compare(got, want, want_top)
    print(f"graphs: {agreement.matched}/{agreement.compared} positions equal, divergences {agreement.divergences}")
    assert_no_blocks_held(graphs)


def test_cuda_graphs_agree_with_eager_steps_at_long_contexts(small_dirs: dict[str, Path]) -> None:
    """A graph's attention is planned at each replay: a 2,000-token context is split into
    many chunks the captured grid must still cover."""
    rng = random.Random(7)
    prompts = [[rng.randrange(5, 8000) for _ in range(2000)] for _ in range(6)]
    kwargs = {"dtype": "bfloat16", "device": "cuda", "num_blocks": 1024, "max_model_len": 2100}
    eager = LLM(str(small_dirs["qwen3"]), cuda_graphs=False, **kwargs)
    want, want_top = run(eager, prompts)
    graphs = LLM(str(small_dirs["qwen3"]), max_num_seqs=8, **kwargs)
    got, _ = run(graphs, prompts)
    assert graphs.engine.runner.graphs is not None and graphs.engine.runner.graphs.replays > NEW // 2
    agreement = compare(got, want, want_top)
    print(f"long graphs: {agreement.matched}/{agreement.compared} positions equal, divergences {agreement.divergences}")
    assert_no_blocks_held(graphs)


def test_prefix_hits_chunked_prefill_and_preemption_on_cuda(small_dirs: dict[str, Path]) -> None:
    path = small_dirs["qwen3"]
    shared = mixed_prompts(7, seed=4)[6]  # 48 tokens: a 3-block prefix
    prompts = mixed_prompts(10, seed=5) + [shared + p for p in mixed_prompts(4, seed=6)]
    want, want_top = hf_greedy(path, prompts)
    # 64-token steps chunk every long prompt; 40 blocks of 16 cannot hold them all at once.
    llm = LLM(str(path), dtype="bfloat16", device="cuda", num_blocks=40, block_size=16,
              max_num_batched_tokens=64)
    got, _ = run(llm, prompts)
    again, _ = run(llm, prompts[-4:], cached=48)  # the shared prefix is cached by now
    compare(got + again, want + want[-4:], want_top + want_top[-4:])
    assert llm.engine.scheduler.num_preemptions > 0
    assert_no_blocks_held(llm)


def test_asking_flashinfer_for_float32_is_an_error_that_says_what_to_use(small_dirs: dict[str, Path]) -> None:
    from pdmesh.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="bfloat16 or float16, not torch.float32; use --dtype bfloat16"):
        LLM(str(small_dirs["llama"]), dtype="float32", device="cuda", num_blocks=64, attention_backend="flashinfer")
