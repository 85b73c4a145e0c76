"""The fused CPU prefill-attention kernel against the torch backend's SDPA calls, alone, on
one layer of a synthetic paged pool, at the serving shapes.

    .venv/bin/python scripts/probes/prefill/prefill_attention_costs.py

Each shape is a step's prefill chunks (q_len, ctx_len): 64-token chunks over 512-token
cached prefixes (the shared-prefix serving shape), whole 256- and 512-token prompts, one
2,048-token prompt (a full step's budget) and 64-token chunks over 1,024-token prefixes.
Prints the largest difference between the two outputs, and ms per call of each, best of
two alternating rounds of ten calls. docs/performance/log.md, section 18.
"""

from __future__ import annotations

import argparse
import time

import torch

from pdmesh.attention.backend import AttentionBackend, AttentionMetadata, PrefillSeq
from pdmesh.attention.cpu_backend import CPUAttentionBackend
from pdmesh.attention.torch_backend import TorchAttentionBackend

BS, HKV, D, HEADS = 16, 4, 64, 8  # the default model's attention
SHAPES = {
    "16 x 64 over 512 cached": [(64, 576)] * 16,
    "8 x 256 prompts": [(256, 256)] * 8,
    "4 x 512 prompts": [(512, 512)] * 4,
    "1 x 2,048 prompt": [(2048, 2048)],
    "8 x 64 over 1,024 cached": [(64, 1088)] * 8,
}


def step(chunks: list[tuple[int, int]], pool: torch.Tensor, g: torch.Generator
         ) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Metadata for the chunks on scattered blocks, queries, and the chunks' own K/V rows
    read back from the pool (as ``write_kv`` leaves them)."""
    perm = torch.randperm(pool.shape[0], generator=g).tolist()
    prefills, tables, used, q_start = [], [], 0, 0
    for q_len, ctx in chunks:
        ids = perm[used : used + -(-ctx // BS)]
        used += len(ids)
        prefills.append(PrefillSeq(q_start, q_len, ctx, torch.tensor(ids)))
        tables.append(ids)
        q_start += q_len
    width = max(len(t) for t in tables)
    zeros = torch.zeros(q_start, dtype=torch.long)
    meta = AttentionMetadata(
        0, zeros, zeros, prefills=tuple(prefills),
        prefill_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        prefill_spans=torch.tensor([(p.q_start, p.q_len, p.ctx_len) for p in prefills]))
    pos = [(p.block_ids[t // BS], t % BS) for p in prefills for t in range(p.ctx_len - p.q_len, p.ctx_len)]
    k = torch.stack([pool[b, 0, o] for b, o in pos])
    v = torch.stack([pool[b, 1, o] for b, o in pos])
    return meta, torch.randn(q_start, HEADS, D, generator=g), k, v


def per_call(backend: AttentionBackend, args: tuple, calls: int = 10) -> float:  # type: ignore[type-arg]
    start = time.perf_counter()
    for _ in range(calls):
        backend.attend(*args)
    return (time.perf_counter() - start) / calls


def main() -> None:
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(1200, 2, BS, HKV, D, generator=g)
    sdpa, fused = TorchAttentionBackend(), CPUAttentionBackend()
    print(f"torch threads {torch.get_num_threads()}; one layer, ms per call (SDPA / fused kernel):")
    for name, chunks in SHAPES.items():
        meta, q, k, v = step(chunks, pool, g)
        args = (q, k, v, pool, meta, D**-0.5)
        diff = (sdpa.attend(*args) - fused.attend(*args)).abs().max().item()
        times: dict[str, list[float]] = {"sdpa": [], "fused": []}
        for _ in range(2):
            times["sdpa"].append(per_call(sdpa, args))
            times["fused"].append(per_call(fused, args))
        a, b = min(times["sdpa"]), min(times["fused"])
        print(f"  {name:26s} {a * 1e3:7.2f} / {b * 1e3:6.2f}  ({a / b:.2f}x, max difference {diff:.1e})")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
