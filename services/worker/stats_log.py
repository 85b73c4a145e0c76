"""What a worker says in its log: one summary when it starts serving, then one line of
throughput and cache use every ``STATS_INTERVAL_S`` while it has work (as vLLM's logger),
so a log alone answers "what is it serving, and how busy is it"."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from services.worker.config import WorkerConfig
from services.worker.worker import Worker

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 10.0


def startup_summary(cfg: WorkerConfig, worker: Worker) -> str:
    eng = worker.engine
    mc, blocks = eng.model_config, eng.pool.stats().num_blocks
    pool_bytes = worker.transport.block_bytes * blocks
    return (f"serving {cfg.model} ({mc.architecture}, {mc.family}) as {cfg.role} {worker.worker_id}: "
            f"dtype {worker.dtype_name}, device {worker.device}, tensor parallel 1, "
            f"{blocks} KV blocks of {cfg.block_size} tokens ({pool_bytes / 2**30:.2f} GiB, "
            f"{blocks * cfg.block_size} tokens), max model len {eng.max_model_len}")


@dataclass(frozen=True)
class Totals:
    at: float
    computed: int
    cached: int
    generated: int


def _read(worker: Worker) -> tuple[Totals, int, int, int, int]:
    """Under the engine lock: the counters, running, waiting, used and total blocks."""
    eng, c = worker.engine, worker.counters
    stats = eng.pool.stats()
    totals = Totals(time.monotonic(), c.computed_prompt_tokens, c.cached_prompt_tokens, eng.generated_tokens)
    return totals, len(eng.scheduler.running), eng.scheduler.num_waiting, stats.used, stats.num_blocks


def stats_line(before: Totals, now: Totals, running: int, waiting: int, used: int, blocks: int) -> str | None:
    """The line for one interval, or None when the worker had nothing to do in it."""
    computed, cached = now.computed - before.computed, now.cached - before.cached
    generated = now.generated - before.generated
    if not (computed or cached or generated or running or waiting):
        return None
    seconds = max(now.at - before.at, 1e-9)
    prompt = computed + cached
    hits = f"{100 * cached / prompt:.1f}%" if prompt else "-"
    return (f"running {running}, waiting {waiting}; prompt {prompt / seconds:.1f} tok/s "
            f"({computed / seconds:.1f} computed), generation {generated / seconds:.1f} tok/s; "
            f"KV {100 * used / max(blocks, 1):.1f}% used ({used}/{blocks} blocks); prefix hits {hits}")


async def log_stats(worker: Worker, interval_s: float = STATS_INTERVAL_S) -> None:
    before = worker.async_engine.call(lambda: _read(worker))[0]
    while True:
        await asyncio.sleep(interval_s)
        now, running, waiting, used, blocks = worker.async_engine.call(lambda: _read(worker))
        line = stats_line(before, now, running, waiting, used, blocks)
        if line is not None:
            log.info("%s", line)
        before = now
