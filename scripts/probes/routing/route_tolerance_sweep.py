"""Sweep cache_aware's route tolerance in the routing simulator over several seeds.

    .venv/bin/python scripts/probes/routing/route_tolerance_sweep.py REDIS_URL [TOLERANCES]

REDIS_URL: an empty redis-server of your own (it is flushed), e.g. from
``.venv/bin/redis-server --port 6399 --save ''``. Prints, per tolerance, the prompt
tokens computed over the oracle's and the TTFT p90 for each seed, and their means
(the traffic of tests/integration/routing/test_route_sim.py: 8 workers, load 0.7).
"""

from __future__ import annotations

import argparse
import statistics

from pdmesh.bench.routing.sim import SimSpec, simulate
from pdmesh.bench.routing.traffic import TrafficSpec, build_traffic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("redis_url", help="an empty redis-server of your own: it is flushed")
    parser.add_argument("tolerances", nargs="?", default="0,0.1,0.3,0.5", help="comma-separated")
    args = parser.parse_args()
    url = args.redis_url
    tolerances = [float(x) for x in args.tolerances.split(",")]
    for tol in tolerances:
        ratios, p90s = [], []
        for seed in range(6):
            traffic = build_traffic(TrafficSpec(num_requests=400, groups=16, prefix_len=256, suffix_len=32,
                                                turns=3, turn_len=16, output_len=16, seed=seed))
            spec = SimSpec(prefill_workers=8, block_size=16, s_per_token=500e-6, overhead_s=0.005,
                           load=0.7, seed=seed, route_tolerance=tol)
            r = simulate("cache_aware", traffic, spec, url)
            ratios.append(sum(len(s.job.tokens) - s.cached - s.fetched for s in r.served) / r.oracle_computed)
            ttft = sorted(s.done - s.arrival for s in r.served)
            p90s.append(1000 * ttft[int(0.9 * len(ttft))])
        print(f"tolerance {tol}: computed/oracle {[round(x, 2) for x in ratios]} mean {statistics.mean(ratios):.3f}, "
              f"TTFT p90 mean {statistics.mean(p90s):.0f} ms", flush=True)


if __name__ == "__main__":
    main()
