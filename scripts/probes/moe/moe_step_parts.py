"""Where a mixture-of-experts layer's time goes at decode sizes: the router (its product,
softmax and top-k), sorting the (token, expert) pairs, and the experts (the CPU kernel
``moe_rows``, and one product per expert for comparison), with the rate at which the
kernel reads the chosen experts' weights; transformers' block on the same weights beside.

    .venv/bin/python scripts/probes/moe/moe_step_parts.py .cache/models/small-qwen3-moe [--tokens 1,16,32]

The model is any folder pdmesh loads whose layers have experts (make it with ``pdmesh model
make-tiny DIR --arch qwen3_moe --size small``); its first sparse layer is measured, float32,
on torch's threads (docs/moe.md keeps the figures).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def _ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model folder with MoE layers")
    parser.add_argument("--tokens", default="1,16,32", help="tokens per step (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=30, help="calls per timing, best of 3 (default: %(default)s)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from pdmesh.attention.cpu_kernels import load
    from pdmesh.model.loader import load_model
    from pdmesh.model.moe import SparseMoE, grouped_experts, sort_by_expert

    model, cfg, _ = load_model(args.model, "float32")
    if cfg.moe is None:
        raise SystemExit(f"{args.model} has no mixture-of-experts layers")
    layer = min(cfg.moe.sparse_layers)
    block = model.layers[layer].mlp
    assert isinstance(block, SparseMoE)
    block.experts.kernels = load()
    hf_block = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval().model.layers[layer].mlp
    expert_bytes = 3 * cfg.hidden_size * cfg.moe.intermediate_size * 4
    print(f"{args.model}: layer {layer}, {cfg.moe.num_experts} experts, {cfg.moe.top_k} per token, "
          f"{expert_bytes / 2**20:.2f} MiB each, {torch.get_num_threads()} threads")
    print(f"{'tokens':>6} {'router':>8} {'sort':>8} {'kernel':>8} {'per-expert':>11} {'transformers':>13} "
          f"{'experts used':>13} {'kernel GB/s':>12}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(tokens))
        with torch.inference_mode():
            ids, weights = block.router(x)
            used = int(torch.unique(ids).numel())
            router = _ms(lambda: block.router(x), args.repeats)
            sort = _ms(lambda: sort_by_expert(ids, cfg.moe.num_experts), args.repeats)
            kernel = _ms(lambda: block.experts(x, ids, weights), args.repeats)
            grouped = _ms(lambda: grouped_experts(x, ids, weights, block.experts), args.repeats)
            theirs = _ms(lambda: hf_block(x[None]), args.repeats)
        rate = used * expert_bytes / (kernel - sort) / 1e6
        print(f"{tokens:>6} {router:>7.3f}m {sort:>7.3f}m {kernel:>7.3f}m {grouped:>10.3f}m {theirs:>12.3f}m "
              f"{used:>13} {rate:>12.1f}")


if __name__ == "__main__":
    main()
