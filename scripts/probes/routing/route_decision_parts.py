"""What a prefill decision at 1,000 workers is made of, part by part (docs/routing.md,
"The index at scale").

    .venv/bin/python scripts/probes/routing/route_decision_parts.py

Prints, on the router's event loop and against a private redis-server:
- the router's Python per part, for 1,000 candidates of which two hold the prompt
  (the registry's pass, finding the holders, the policy, the recent routes);
- a Redis round trip through redis-py (PING, and a script that returns at once) against a
  PING over a bare asyncio protocol;
- Redis's own time per lookup (INFO commandstats) for a 64-block prefix held by H
  workers, two of them 6 blocks deeper, for H in 2, 8, 32, 128, 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable

from pdmesh.index import keys
from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.update import UPDATE, IndexUpdate
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.mesh_types import WorkerInfo
from pdmesh.rpc.process import run_service_loop
from services.router.config import RouterConfig
from services.router.policies import RouteContext, build_policy
from services.router.prefill_routing import PrefillRouter, select_members
from services.router.worker_handle import WorkerHandle


def per_call_us(fn: Callable[[], object], n: int = 3000) -> float:
    began = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - began) / n * 1e6


async def per_await_us(fn: Callable[[], object], n: int = 3000) -> float:
    began = time.perf_counter()
    for _ in range(n):
        await fn()  # type: ignore[misc]
    return (time.perf_counter() - began) / n * 1e6


def python_parts() -> None:
    handles = []
    for i in range(1000):
        w = WorkerHandle(f"sim:{i}", "prefill", healthy=True)
        w.info = WorkerInfo(worker_id=f"prefill-{i}", role="prefill", epoch="e0", prefill_us_per_token=700,
                            kvstore_us_per_token=70)
        handles.append(w)
    chain = BlockHasher(16).hash_tokens([random.randrange(10, 8000) for _ in range(1152)])
    router = PrefillRouter(build_policy("cache_aware", RouterConfig(model="sim")), None, 16)
    indexed = {"prefill-3": {"e0": 64}, "prefill-700": {"e0": 64}}
    ctx = RouteContext(chain, chain[0], {"prefill-3": 64, "prefill-700": 64}, 16, 0, 1152,
                       [handles[3], handles[700]], recurring=True)
    groups = [(64, [keys.member(f"prefill-{i}", "e0") for i in range(128)])]
    rng = random.Random(0)
    print("the router's Python at 1,000 candidates, us per call:")
    for name, fn in [
        ("the registry's pass for healthy workers", lambda: [w for w in handles if w.role == "prefill" and w.healthy]),
        ("finding 2 holders among the candidates", lambda: router.by_id.holding(list(handles), indexed, {})),
        ("  the same by a pass over them (the way before)", lambda: {w: 1 for w in handles if w.worker_id in indexed}),
        ("choosing 32 of 128 index holders", lambda: select_members(groups, 32, rng)),
        ("cache_aware's choice (2 holders + its sample)", lambda: router.policy.choose(handles, ctx)),
        ("random.sample of 32", lambda: rng.sample(handles, 32)),
        ("random.choices of 32", lambda: rng.choices(handles, k=32)),
        ("remembering the route (72 blocks)", lambda: router.recent.remember(chain, "prefill-3")),
    ]:
        print(f"  {name:48s} {per_call_us(fn):8.1f}")


class _Ping(asyncio.Protocol):
    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[bytes]] = []
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n" in self.buffer:
            line, _, self.buffer = self.buffer.partition(b"\r\n")
            self.waiting.pop(0).set_result(line)


async def redis_parts(url: str, port: int) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    loop = asyncio.get_running_loop()
    transport, bare = await loop.create_connection(_Ping, "127.0.0.1", port)

    async def bare_ping() -> bytes:
        future: asyncio.Future[bytes] = loop.create_future()
        bare.waiting.append(future)
        transport.write(b"*1\r\n$4\r\nPING\r\n")
        return await future

    empty = client.register_script("return 0")
    print("a Redis round trip, us:")
    print(f"  redis-py PING                                    {await per_await_us(client.ping):8.1f}")
    print(f"  redis-py, a script that returns at once          {await per_await_us(empty):8.1f}")
    print(f"  PING over a bare asyncio protocol                {await per_await_us(bare_ping):8.1f}")
    transport.close()

    update = client.register_script(UPDATE)
    index = PrefixIndex(url)
    print("Redis's own time per lookup, a 64-block prefix held by H workers (two 6 blocks deeper):")
    for holders in (2, 8, 32, 128, 1000):
        await client.flushdb()
        chain = BlockHasher(16).hash_tokens([random.randrange(10, 8000) for _ in range(1152)])
        for j in range(holders):
            held = IndexUpdate(keys.member(f"prefill-{j}", "e0"))
            held.add(chain[:70] if j < 2 else chain[:64])
            for call in held.calls(batch=1):
                await update(args=call)
        await index.longest_prefix(chain)
        await client.config_resetstat()
        wall = await per_await_us(lambda: index.longest_prefix(chain), 500)  # noqa: B023
        stats = (await client.info("commandstats"))["cmdstat_evalsha"]
        print(f"  H={holders:5d}: Redis {stats['usec_per_call']:8.1f} us, round trip with parsing {wall:8.1f} us")
    await index.close()
    await client.aclose()


def main() -> None:
    python_parts()
    redis = Mesh(MeshSpec(model="sim"))
    redis.start_redis()
    try:
        run_service_loop(redis_parts(redis.redis_url, redis.redis_port))
    finally:
        redis.stop_redis()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
