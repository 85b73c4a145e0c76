"""Send a workload to a target with an arrival process; collect one ``Record`` per request.

Arrivals: ``rate`` inf sends everything at once; otherwise gaps are drawn from a gamma
distribution with mean 1 / rate (``burstiness`` 1 = Poisson). ``max_concurrency`` caps the
requests in flight. Turn t + 1 of a chat session starts only after turn t has finished
and carries its answer, as a user would.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass

from pdmesh.bench.serve.targets import Record, Target
from pdmesh.bench.serve.workloads import Request


@dataclass(frozen=True)
class Arrivals:
    rate: float = float("inf")
    """Requests per second; inf = all at once."""
    burstiness: float = 1.0
    max_concurrency: int = 0
    """0 = unlimited."""
    seed: int = 0


class _Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.done, self.label, self.enabled = total, 0, label, enabled
        self.start = time.perf_counter()

    def step(self) -> None:
        self.done += 1
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            bar = "#" * (30 * self.done // self.total)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {elapsed:6.1f}s")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


async def run(target: Target, requests: list[Request], arrivals: Arrivals, progress: bool = True
              ) -> tuple[list[Record], float]:
    """Records in request order, and the wall time from first send to last finish."""
    rng = random.Random(arrivals.seed)
    limit = asyncio.Semaphore(arrivals.max_concurrency) if arrivals.max_concurrency else None
    records: list[Record | None] = [None] * len(requests)
    bar = _Progress(len(requests), target.name, progress)
    sessions: dict[int, asyncio.Event] = {}
    history: dict[int, list[int]] = {}

    async def one(i: int, req: Request) -> None:
        if req.session >= 0 and req.turn > 0:  # wait for the previous turn, then extend it
            await sessions[req.session * 1000 + req.turn - 1].wait()
        prompt = req.prompt
        if not isinstance(prompt, str) and req.session >= 0:  # a session's prompts are token ids
            prompt = history.get(req.session, []) + prompt + (req.follow_up if req.turn else [])
        if limit is not None:
            await limit.acquire()
        rec = Record(time.perf_counter(), prompt_tokens=len(prompt))
        try:
            await target.send(prompt, req.max_tokens, rec)
        finally:
            if limit is not None:
                limit.release()
            records[i] = rec
            bar.step()
            if not isinstance(prompt, str) and req.session >= 0:
                history[req.session] = prompt + rec.token_ids
                sessions[req.session * 1000 + req.turn].set()

    for req in requests:
        if req.session >= 0:
            sessions[req.session * 1000 + req.turn] = asyncio.Event()
    start = time.perf_counter()
    tasks = []
    for i, req in enumerate(requests):
        tasks.append(asyncio.create_task(one(i, req)))
        if arrivals.rate != float("inf"):
            shape = 1.0 / arrivals.burstiness
            await asyncio.sleep(rng.gammavariate(shape, 1.0 / (arrivals.rate * shape)))
    await asyncio.gather(*tasks)
    return [r for r in records if r is not None], time.perf_counter() - start
