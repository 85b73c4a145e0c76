"""What pdmesh's few-row linear kernel buys, and a pool layout that bought nothing.

Three parts, each alternating its sides in one process (docs/performance/log.md, sections 12
and 22):
  1. products over the default model's eight layers of weights (qkv, o, gate/up, down),
     MKL's transposed product against ``linear_rows`` and oneDNN's packed product (where
     torch has it), per row count, beside the floor: reading each weight once (a sum);
  2. whole decode steps of one engine (128-token contexts), ``linear_rows`` on and off
     (the default plan vs one with MKL's product up to ``KERNEL_MAX_ROWS`` too), per batch
     size (64 is a control: MKL on both sides),
     with oneDNN off (``PDMESH_ONEDNN=0``: where it wins it would serve both sides);
  3. the paged decode attention kernel over a pool on 4 KiB pages against one advised to
     use transparent huge pages (batch 32, ~600-token contexts, scattered blocks).

    .venv/bin/python scripts/probes/linear/linear_rows_costs.py [MODEL_DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random

import torch
from linear_rows_ab import SHAPES

from pdmesh.attention.cpu_kernels import load
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.model import onednn
from pdmesh.model.layers import transposed_mm
from pdmesh.model.linear_plan import DEFAULT_PRODUCTS, KERNEL_MAX_ROWS, LinearPlan, Product, best_seconds
from pdmesh.sampling_params import SamplingParams

KERNELS = load()


def best(fn, rounds: int = 3, n: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call: the best of ``rounds`` rounds of ``n`` calls."""
    return best_seconds(fn, rounds=rounds, reps=n, warmup=0)


def products() -> None:
    weights = [[torch.randn(o, i) * 0.02 for o, i in SHAPES] for _ in range(8)]
    packed = {id(w): onednn.pack(w) for ws in weights for w in ws} if onednn.available() else {}
    print("part 1: products over 8 layers' weights, ms (GFLOP/s); floor: summing each weight once")
    for rows in (1, 2, 4, 8, 12, 16, 20, 24, 31, 32, 64):
        xs = {i: torch.randn(rows, i) for _, i in SHAPES}
        flops = 2 * rows * sum(o * i for o, i in SHAPES) * 8

        def run(fn, xs=xs):  # type: ignore[no-untyped-def]
            return lambda: [fn(xs[w.shape[1]], w) for ws in weights for w in ws]

        mkl = best(run(transposed_mm))
        ours = best(run(KERNELS.linear_rows))
        floor = best(run(lambda x, w: w.sum()))
        line = (f"  {rows:3d} rows: MKL {mkl * 1e3:6.1f} ({flops / mkl / 1e9:3.0f})  linear_rows "
                f"{ours * 1e3:6.1f} ({flops / ours / 1e9:3.0f})  {mkl / ours:.2f}x")
        if packed:
            dnn = best(run(lambda x, w: onednn.product(x, packed[id(w)], None)))
            line += f"  oneDNN packed {dnn * 1e3:6.1f} ({flops / dnn / 1e9:3.0f})"
        print(line + f"  floor {floor * 1e3:5.1f}")


def decode_steps(model: str) -> None:
    # The engine would time oneDNN at start-up and, on machines where it wins (AVX-512),
    # serve every row count with it: both sides below would then run oneDNN.
    os.environ["PDMESH_ONEDNN"] = "0"
    print("part 2: decode steps, 128-token contexts, ms per step (median of 5 alternations; oneDNN off)")
    for batch in (1, 4, 8, 16, 24, 32, 48, 64):
        eng = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=2048).engine_config())
        rng = random.Random(0)
        for i in range(batch):
            eng.add_request(str(i), [rng.randrange(3, 8000) for _ in range(128)],
                            SamplingParams(max_tokens=300, ignore_eos=True, temperature=0.0))
        for _ in range(5):
            eng.step()
        mkl = LinearPlan(tuple(Product.MM if p is Product.KERNEL else p for p in DEFAULT_PRODUCTS))
        res: dict[LinearPlan, list[float]] = {LinearPlan(): [], mkl: []}
        for _ in range(5):
            for plan, out in res.items():
                eng.runner.model.apply_linear_plan(plan)
                out.append(best(eng.step, rounds=1, n=8) * 1e3)
        on, off = (sorted(v)[2] for v in res.values())
        control = "  (control: MKL on both sides)" if batch > KERNEL_MAX_ROWS else ""
        print(f"  batch {batch:2d}: linear_rows {on:5.1f}  MKL {off:5.1f}  {off / on:.2f}x{control}")


def pool_pages() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    blocks, huge = 4096, 2 << 20
    print("part 3: paged decode attention, ms per layer, 4 KiB pages vs huge pages")
    pools = {}
    for name in ("4k", "huge"):
        base = torch.empty(blocks * 4 * 2 * 16 * 4 * 64 + huge // 4)  # 4 layers, like the engine's pool
        skip = (-base.data_ptr() % huge) // 4
        pool = base[skip : skip + blocks * 4 * 2 * 16 * 4 * 64]
        if name == "huge":
            libc.madvise(pool.data_ptr(), pool.numel() * 4 // huge * huge, 14)  # MADV_HUGEPAGE
        pools[name] = pool.normal_().view(blocks, 4, 2, 16, 4, 64)[:, 1]
    tables = torch.randperm(blocks)[: 32 * 40].view(32, 40).contiguous()
    lens = torch.tensor([580 + (i * 7) % 40 for i in range(32)])
    q = torch.randn(32, 8, 64)
    for _ in range(3):
        line = [f"{name} {best(lambda p=p: KERNELS.paged_decode(q, p, tables, lens, 0.125), 1, 20) * 1e3:.2f}"
                for name, p in pools.items()]
        print("  " + "  ".join(line))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=".cache/models/small-llama", help="a model folder")
    model = parser.parse_args().model
    torch.set_num_threads(2)
    products()
    decode_steps(model)
    pool_pages()
