"""What status a router reads from a ``PrefillStream`` its prefill worker refuses at once.

The router sends a request, then its destination as soon as the decode worker reserved
(a millisecond or two later). When the worker refuses the request (here a token outside
the vocabulary: INVALID_ARGUMENT) and its status reaches the router before that second
write, the write fails on the closed stream and grpcio's asyncio client may report the
call INTERNAL, "Internal error from Core", over the worker's status (grpc/grpc#36066);
the router then takes the worker for broken. This sends ``--tries`` such calls per delay
between the two writes against a real prefill worker and counts (delay, second write
landed or refused, status code):

    .venv/bin/python scripts/probes/mesh/refused_status_probe.py --model .cache/models/small-llama
"""

from __future__ import annotations

import argparse
import asyncio
import collections

import grpc

from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.rpc import messages
from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import worker_pb2, worker_pb2_grpc

DELAYS_MS = (0, 0.3, 0.6, 1, 1.5, 2, 3, 5)


async def probe(address: str, tries: int) -> collections.Counter[tuple[float, str, str]]:
    seen: collections.Counter[tuple[float, str, str]] = collections.Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.PrefillStub(channel)
        for delay_ms in DELAYS_MS:
            for i in range(tries):
                rid = f"refused-{delay_ms}-{i}"
                call = stub.PrefillStream(timeout=10)
                await call.write(messages.prefill_request(rid, [5, 10**6, 7], SamplingParams(max_tokens=2), None))
                await asyncio.sleep(delay_ms / 1000)
                landed = "landed"
                try:
                    await call.write(messages.destination_message(rid, worker_pb2.KvHandle(worker_id="decode-0")))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    landed = "refused"
                try:
                    await call.read()
                    code = "an answer"
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                seen[(delay_ms, landed, code)] += 1
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tries", type=int, default=40, help="calls per delay")
    args = ap.parse_args()
    spec = MeshSpec(model=args.model, prefill=1, decode=1, worker_args=["--dtype", "float32", "--num-blocks", "64"])
    with Mesh(spec) as mesh:
        seen = asyncio.run(probe(mesh.prefill[0].address, args.tries))
    print("delay ms | second write | status | calls")
    for (delay, landed, code), n in sorted(seen.items()):
        print(f"{delay:>8} | {landed:>12} | {code} | {n}")
    wrong = sum(n for (_, _, code), n in seen.items() if code != "INVALID_ARGUMENT")
    print(f"{wrong} of {sum(seen.values())} calls ended with another status than INVALID_ARGUMENT")


if __name__ == "__main__":
    main()
