"""What a prefill worker's eviction order costs on route-mesh's traffic, without a mesh.

``pdmesh bench route-mesh``'s traffic (its defaults: 12 Zipf-popular 512-token prefixes,
64-token suffixes, 30% conversations of 3 turns) is split between two workers as
``cache_aware`` settles it (each prefix on the worker that first computed it, the first
sightings alternating), and each worker's requests run one at a time, in arrival order, through the
engine's own ``KVCacheManager`` and ``BlockPool`` of route-mesh's size (320 blocks less
two prompts in flight).
Prints, per policy, the prompt tokens computed against the oracle's and which blocks were
computed again after their eviction: those of the shared prefixes or the rest (suffixes,
conversation turns). Ignores timing (requests in flight together, the order arrivals take
on a real mesh), so it shows the eviction order's share of the recomputation, not a mesh's.

    .venv/bin/python scripts/probes/routing/prefix_eviction_model.py [--requests 160,480] [--seeds 4]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from pdmesh.bench.routing.mesh_command import TRAFFIC
from pdmesh.bench.routing.traffic import Job, Traffic, build_traffic
from pdmesh.bench.routing.workers import through_engine_cache
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.block_pool import BlockPool
from pdmesh.kv.eviction import EvictionPolicy
from pdmesh.kv.kv_cache_manager import KVCacheManager

BS = 16
TURN_GAP = 20
"""Starts that arrive between a turn and the conversation's next (~2 s at route-mesh's 70%
load: the answer's 16 tokens and the 1 s mean think time)."""


def arrival_order(traffic: Traffic) -> list[Job]:
    """The starts in order, each later turn ``TURN_GAP`` starts after the one before it."""
    order: list[Job] = []
    due: list[tuple[int, int, Job]] = []
    for job in traffic.starts:
        order.append(job)
        if job.next_turn is not None:
            due.append((len(order) + TURN_GAP, job.index, job.next_turn))
        due.sort(key=lambda d: (d[0], d[1]))
        while due and due[0][0] <= len(order):
            nxt = due.pop(0)[2]
            order.append(nxt)
            if nxt.next_turn is not None:
                due.append((len(order) + TURN_GAP, nxt.index, nxt.next_turn))
                due.sort(key=lambda d: (d[0], d[1]))
    return order + [d[2] for d in due]


def run(traffic: Traffic, policy: EvictionPolicy, pool_blocks: int) -> tuple[int, int, int]:
    """(tokens computed, prefix blocks computed again, other blocks computed again)."""
    hasher = BlockHasher(BS)
    caches = [KVCacheManager(BlockPool(pool_blocks, eviction=policy), hasher) for _ in range(2)]
    home: dict[bytes, int] = {}
    seen: set[bytes] = set()
    computed = again_prefix = again_other = 0
    prefix_blocks = traffic.spec.prefix_len // BS
    for job in arrival_order(traffic):
        tokens = job.tokens
        hashes = hasher.hash_tokens(tokens)
        kv = caches[home.setdefault(hashes[0], len(home) % 2)]
        hits = through_engine_cache(kv, str(job.index), tokens)
        for i in range(hits, len(hashes)):
            if hashes[i] in seen:
                again_prefix += i < prefix_blocks
                again_other += i >= prefix_blocks
        seen.update(hashes)
        computed += len(tokens) - hits * BS
    return computed, again_prefix, again_other


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", default="160,480", help="traffic sizes (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=4, help="traffic seeds 0.. (default: %(default)s)")
    p.add_argument("--pool-blocks", type=int, default=320 - 2 * 45,
                   help="each worker's pool less two longest prompts in flight (default: %(default)s)")
    args = p.parse_args()
    print("requests seed  policy  computed/oracle  prefix blocks again  other blocks again")
    for n in (int(x) for x in args.requests.split(",")):
        for seed in range(args.seeds):
            traffic = build_traffic(replace(TRAFFIC, num_requests=n, seed=seed))
            oracle = traffic.oracle_computed(BS)
            for policy in ("lru", "reuse"):
                computed, prefix, other = run(traffic, policy, args.pool_blocks)
                print(f"{n:8d} {seed:4d}  {policy:6s}  {computed / oracle:15.3f}  {prefix:19d}  {other:18d}")


if __name__ == "__main__":
    main()
