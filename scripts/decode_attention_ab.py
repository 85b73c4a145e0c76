"""Two builds of the decode-attention kernel side by side in one process: the same inputs,
calls alternated, the best of 15 rounds of 10 calls each, and their outputs checked equal
bit for bit. A/B runs inside one process are what a noisy machine still resolves.

    .venv/bin/python scripts/decode_attention_ab.py OLD.so NEW.so [THREADS]

Build the old side from a worktree (``git worktree add /tmp/old COMMIT``, then in it
``PYTHONPATH=/tmp/old .venv/bin/python -c "from pdmesh.attention.cpu_kernels import load;
print(load().__file__)"``) and the new one the same way here; each prints its ``.so``.
docs/performance.md, section 25.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from types import ModuleType

import torch

from decode_attention_costs import BS, D, HEADS, HKV, tables

CASES = {  # label: (sequences, shared prefixes, prefix tokens, own tokens)
    "64 x (512 shared of 4 + 64-123 own)": (64, 4, 512, 64),
    "64 x (512 shared of 4 + 1-60 own)": (64, 4, 512, 1),
    "32 x 256-315 private": (32, 0, 0, 256),
}


def module(path: str) -> ModuleType:
    name = path.rsplit("/", 1)[-1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(old: ModuleType, new: ModuleType, rounds: int = 15, calls: int = 10) -> None:
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(8000, 2, BS, HKV, D, generator=g)
    perm = torch.randperm(8000, generator=g).tolist()
    for label, (batch, groups, prefix, suffix) in CASES.items():
        table, lens = tables(random.Random(0), perm, batch, groups, prefix, suffix)
        q = torch.randn(batch, HEADS, D, generator=g)
        sides = {"old": old, "new": new}
        outs = {k: m.paged_decode(q, pool, table, lens, D**-0.5) for k, m in sides.items()}
        assert torch.equal(outs["old"], outs["new"]), f"{label}: the builds' bits differ"
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(rounds):
            for k, m in sides.items():
                start = time.perf_counter()
                for _ in range(calls):
                    m.paged_decode(q, pool, table, lens, D**-0.5)
                best[k] = min(best[k], (time.perf_counter() - start) / calls * 1e3)
        print(f"{label}: old {best['old']:.3f} ms, new {best['new']:.3f} ms, "
              f"new / old {best['new'] / best['old']:.3f} (bits equal)")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else torch.get_num_threads())
    print(f"torch threads {torch.get_num_threads()}; one layer, ms per call")
    main(module(sys.argv[1]), module(sys.argv[2]))
