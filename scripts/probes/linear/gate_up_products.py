"""gate and up as two oneDNN products against one over their stacked weights.

Times, per row count, the eight layers' MLP gate/up products of the default model's shapes
(2,048 x 512 each) packed separately against packed as one (4,096 x 512), median of 200
calls, twice (docs/performance/log.md, section 23). Needs a torch with oneDNN.

    .venv/bin/python scripts/probes/linear/gate_up_products.py
"""

from __future__ import annotations

import argparse
import time

import torch

from pdmesh.model import onednn

LAYERS, HIDDEN, INTERMEDIATE = 8, 512, 2048


def median_ms(fn, n: int = 200) -> float:  # type: ignore[no-untyped-def]
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1e3


def main() -> None:
    torch.manual_seed(0)
    gates = [torch.randn(INTERMEDIATE, HIDDEN) for _ in range(LAYERS)]
    ups = [torch.randn(INTERMEDIATE, HIDDEN) for _ in range(LAYERS)]
    separate = [(onednn.pack(g), onednn.pack(u)) for g, u in zip(gates, ups)]
    fused = [onednn.pack(torch.cat([g, u])) for g, u in zip(gates, ups)]
    for rows in (1, 2, 4, 16, 64, 256):
        x = torch.randn(rows, HIDDEN)
        two = lambda: [(onednn.product(x, g, None), onednn.product(x, u, None)) for g, u in separate]  # noqa: E731
        one = lambda: [onednn.product(x, w, None) for w in fused]  # noqa: E731
        print(f"rows {rows:3d}: two products {median_ms(two):.3f} ms, one {median_ms(one):.3f} ms | "
              f"again: two {median_ms(two):.3f}, one {median_ms(one):.3f}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not onednn.available():
        raise SystemExit("this torch build has no oneDNN (mkldnn)")
    main()
