"""How close a 512-token prefill runs to this machine's float32 GEMM rate, ours and
``transformers``'s, and what issue 8's "1.5x transformers on prefill" would ask of it.

    .venv/bin/python scripts/probes/prefill/prefill_roofline.py [--model .cache/models/small-llama]

1. The machine's rate: the best of five square float32 products (2048^3) and of five
   prefill-shaped ones (2048 rows through the MLP's up projection), torch's MKL on every core.
2. The model's work per prompt token at 512-token prompts: every linear layer (2 FLOPs per
   weight), causal attention (QK^T and PV over on average half the prompt) and the LM head
   on the last token only; pdmesh's own, whose last layer computes past its fused q/k/v
   product for the last token only (docs/performance/log.md section 36).
3. Prefill of 8 x 512 tokens, best of three alternating rounds: our engine (engine steps, as
   ``pdmesh bench engine`` runs it) and one batched ``transformers`` forward.
Prints each side's GFLOP/s as a share of the machine's rate, and the share a prefill 1.5x
transformers' would need.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from pdmesh.bench.engine import _hf_prefill, _prompts, _run_engine
from pdmesh.engine.llm_engine import LLMEngine

PROMPTS, PROMPT_LEN = 8, 512


def gemm_gflops(m: int, k: int, n: int, rounds: int = 5) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def flops_per_token(config: dict, prompt_len: int, last_layer_cut: bool = False) -> float:
    """FLOPs per prompt token of a prefill; ``last_layer_cut``: the last layer's attention,
    output product and MLP for the last token alone."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or h // heads
    per_layer = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h + 3 * h * inter
    attention = 2 * 2 * heads * head_dim * (prompt_len + 1) / 2  # QK^T and PV, causal
    lm_head = h * config["vocab_size"] / prompt_len  # the last token's logits only
    full = 2 * layers * per_layer + layers * attention + 2 * lm_head
    if not last_layer_cut:
        return full
    past_qkv = 2 * (heads * head_dim * h + 3 * h * inter) + attention
    return full - past_qkv * (prompt_len - 1) / prompt_len


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=".cache/models/small-llama")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(args.model) / "config.json").read_text())
    engine = LLMEngine.from_model(args.model, dtype="float32", num_blocks=4096)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    print(f"{torch.get_num_threads()} threads")
    square = gemm_gflops(2048, 2048, 2048)
    shaped = gemm_gflops(2048, config["hidden_size"], config["intermediate_size"])
    peak = max(square, shaped)
    print(f"float32 GEMM: 2048^3 {square:.1f} GFLOP/s, 2048 x {config['hidden_size']} x "
          f"{config['intermediate_size']} {shaped:.1f} GFLOP/s")

    rng = random.Random(0)
    vocab = config["vocab_size"]
    _run_engine(engine, _prompts(2, 32, rng, vocab), 2)  # warm-up
    prompts = _prompts(PROMPTS, PROMPT_LEN, rng, vocab)
    _hf_prefill(hf, prompts)
    ours, theirs = [], []
    for _ in range(3):
        ours.append(_run_engine(engine, prompts, 1)["seconds"])
        engine.pool.reset_prefix_cache()
        theirs.append(_hf_prefill(hf, prompts))
    tokens = PROMPTS * PROMPT_LEN
    work = flops_per_token(config, PROMPT_LEN)
    cut = flops_per_token(config, PROMPT_LEN, last_layer_cut=True)
    print(f"model work: {work / 1e6:.1f} MFLOP per prompt token at {PROMPT_LEN}-token prompts "
          f"(pdmesh's, the last layer cut: {cut / 1e6:.1f})")
    for name, seconds, flops in (("pdmesh", min(ours), cut), ("transformers", min(theirs), work)):
        rate = tokens / seconds
        print(f"{name:12s} prefill {PROMPTS} x {PROMPT_LEN}: {rate:7.0f} tok/s = "
              f"{rate * flops / 1e9:6.1f} GFLOP/s = {rate * flops / 1e9 / peak:.0%} of the GEMM rate")
    target = 1.5 * tokens / min(theirs)
    print(f"1.5x transformers: {target:.0f} tok/s = {target * cut / 1e9:.1f} GFLOP/s of pdmesh's work = "
          f"{target * cut / 1e9 / peak:.0%} of the GEMM rate (pdmesh now {min(theirs) / min(ours):.2f}x)")


if __name__ == "__main__":
    main()
