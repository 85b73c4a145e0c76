"""pdmesh's benchmarks (``pdmesh bench ...``): each prints a table and writes JSON."""

BENCH_DTYPE_HELP = ("weights and KV dtype (default: float32, in which benchmarks compare engines; a service's "
                    "own default is auto)")
"""The help of every benchmark's --dtype."""
