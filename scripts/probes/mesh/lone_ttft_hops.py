"""Where a lone request's time to first token goes in the mesh, hop by hop.

Starts 1 prefill + 1 decode worker and the router as ``pdmesh up`` does on this machine,
then for fresh prompts sent one at a time alternates three ways of getting the first token:

- ``router``: ``Generate`` through the router (what a caller sees);
- ``direct``: the hand-off's calls made from here one after another — ``Reserve`` on the
  decode worker, ``Prefill`` on the prefill worker (its response says how long it computed
  and transferred), the first message of ``Decode`` — each timed (the router overlaps
  ``Reserve`` with the prefill, ``services/router/request/handoff.py``: router - direct is what
  that and skipping the ``Decode`` message save);
- ``local``: ``GenerateLocal`` on the decode worker, which prefills the prompt itself (one
  hop and the engine: the floor the mesh is measured against);
then, once the mesh has stopped, ``in process``: the same number of fresh prompts through
an engine in this process on every core, one at a time with the same gap (what ``pdmesh
bench mesh`` measures the lone request against).

Requests are 2.5 x ``LEND_AFTER_IDLE_S`` apart (``--gap-ms``): a prefill that starts within
that hold of the other worker's last engine step finds its cores not lent and runs on half
the machine (a 256-token prompt on 2 cores: ~245 ms instead of ~140; ``--gap-ms 50
--verbose`` shows it), which would swamp the hops.

    .venv/bin/python scripts/probes/mesh/lone_ttft_hops.py --model .cache/models/small-llama [--n 16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from pdmesh.bench.stats import pct
from pdmesh.client import AsyncClient
from pdmesh.engine.async_engine import LEND_AFTER_IDLE_S
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.rpc import messages
from pdmesh.rpc.clients import decode_stub, prefill_stub
from pdmesh.sampling_params import SamplingParams


async def _router(client: AsyncClient, prompt: list[int], rid: str) -> dict[str, float]:
    t0 = time.perf_counter()
    async for resp in client.generate(prompt, max_tokens=1, temperature=0, ignore_eos=True):
        if resp.token_ids:
            return {"ttft": time.perf_counter() - t0}
    raise RuntimeError(f"{rid}: the router streamed no token")


ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


async def _first_message(call) -> None:  # type: ignore[no-untyped-def]
    """Until ``call`` streams a token; then leave it."""
    async for out in call:
        if out.token_ids:
            break
    call.cancel()


async def _direct(mesh: Mesh, prompt: list[int], rid: str) -> dict[str, float]:
    d = decode_stub(mesh.decode[0].address)
    p = prefill_stub(mesh.prefill[0].address)
    t0 = time.perf_counter()
    handle = await d.Reserve(messages.reserve_request(rid, prompt, ONE_TOKEN, 30_000), timeout=30)
    t1 = time.perf_counter()
    resp = await p.Prefill(messages.prefill_request(rid, prompt, ONE_TOKEN, handle), timeout=30)
    t2 = time.perf_counter()
    await _first_message(d.Decode(messages.decode_request(rid, resp, handle), timeout=30))
    t3 = time.perf_counter()
    return {"ttft": t3 - t0, "reserve": t1 - t0, "prefill_call": t2 - t1,
            "prefill_compute": resp.prefill_ms / 1000, "transfer": resp.transfer_ms / 1000,
            "prefill_beyond": (t2 - t1) - resp.prefill_ms / 1000, "decode_first": t3 - t2}


async def _local(mesh: Mesh, prompt: list[int], rid: str) -> dict[str, float]:
    d = decode_stub(mesh.decode[0].address)
    t0 = time.perf_counter()
    await _first_message(d.GenerateLocal(messages.reserve_request(rid, prompt, ONE_TOKEN, 30_000), timeout=30))
    return {"ttft": time.perf_counter() - t0}


async def _run(mesh: Mesh, n: int, plen: int, seed: int, gap_s: float, verbose: bool) -> None:
    rng = random.Random(seed)
    client = AsyncClient(mesh.router_address)  # one channel, kept, as a caller keeps it
    ways = {"router": lambda p, r: _router(client, p, r),
            "direct": lambda p, r: _direct(mesh, p, r), "local": lambda p, r: _local(mesh, p, r)}
    results: dict[str, list[dict[str, float]]] = {k: [] for k in ways}
    for i in range(-2, n):  # two warm-up rounds
        order = list(ways)
        rng.shuffle(order)
        for way in order:
            prompt = [rng.randrange(10, 1000) for _ in range(plen)]
            res = await ways[way](prompt, f"hops-{way}-{i}")
            if i >= 0:
                results[way].append(res)
            await asyncio.sleep(gap_s)
    await client.close()
    print(f"{n} prompts of {plen} tokens each way, one at a time (ms, p50 / p90)")
    for way, rows in results.items():
        for key in rows[0]:
            vals = [r[key] for r in rows]
            print(f"  {way:7s} {key:16s} {1000 * pct(vals, 0.5):8.2f} {1000 * pct(vals, 0.9):8.2f}")
        if verbose:
            print("          every ttft:", " ".join(f"{1000 * r['ttft']:.0f}" for r in rows))


def _in_process(model: str, dtype: str, n: int, plen: int, seed: int, gap_s: float) -> None:
    import os

    from pdmesh.bench.engine import _run_engine
    from pdmesh.engine.llm_engine import LLMEngine

    rng = random.Random(seed + 1)
    engine = LLMEngine.from_model(model, dtype=dtype, num_blocks=2048, threads=os.cpu_count() or 1)
    ttfts = []
    for i in range(-2, n):
        ttft = _run_engine(engine, [[rng.randrange(10, 1000) for _ in range(plen)]], 1)["ttft_p50"]
        if i >= 0:
            ttfts.append(ttft)
        time.sleep(gap_s)
    print(f"  in process ttft       {1000 * pct(ttfts, 0.5):8.2f} {1000 * pct(ttfts, 0.9):8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gap-ms", type=float, default=2500 * LEND_AFTER_IDLE_S,
                    help="between requests; the default is past the engines' idle hold, so each "
                         "prefill finds its peer's cores lent")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads per worker (default: pdmesh up's core shares, lent while idle)")
    ap.add_argument("--verbose", action="store_true", help="print every request's TTFT")
    args = ap.parse_args()
    worker_args = ["--dtype", args.dtype, "--num-blocks", "2048"]
    if args.threads:  # fixed threads per worker: no core shares, nothing lent
        worker_args += ["--threads", str(args.threads)]
    spec = MeshSpec(model=args.model, prefill=1, decode=1, worker_args=worker_args)
    spec.router_args += spec.colocated_router_args()
    with Mesh(spec) as mesh:
        asyncio.run(_run(mesh, args.n, args.prompt_len, args.seed, args.gap_ms / 1000,
                         args.verbose))
    _in_process(args.model, args.dtype, args.n, args.prompt_len, args.seed, args.gap_ms / 1000)


if __name__ == "__main__":
    main()
