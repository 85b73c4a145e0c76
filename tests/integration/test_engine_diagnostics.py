"""What an engine tells a person profiling it: the step log, and thread names the kernel
shows (which ``pdmesh bench serve``'s CPU accounting reads)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from pdmesh.bench.serve import cpu
from pdmesh.config import CacheConfig, EngineConfig
from pdmesh.engine.async_engine import AsyncLLMEngine
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.step_log import ENV
from pdmesh.sampling_params import SamplingParams


def _engine(llama_dir: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(llama_dir), dtype="float32", cache=CacheConfig(block_size=4,
                                                                                         num_blocks=128)))


def test_the_step_log_has_one_line_per_step_with_its_prompt_tokens_and_decode_rows(
        llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "steps.tsv"))
    log = tmp_path / f"steps.tsv.{os.getpid()}"  # one file per process
    engine = _engine(llama_dir)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    engine.add_request("a", list(range(5, 25)), params)
    engine.add_request("b", list(range(30, 37)), params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    engine.step_log.close()  # type: ignore[union-attr]
    lines = log.read_text().splitlines()
    assert lines[0].startswith("# pid") and len(lines) == 1 + steps
    rows = [[float(x) for x in line.split("\t")] for line in lines[1:]]
    assert sum(r[2] for r in rows) == 20 + 7  # every prompt token, once
    assert sum(r[3] for r in rows) == 2 * 4  # then four decode rows each
    assert all(r[1] > 0 for r in rows) and [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert all(0 < r[6] <= r[1] + 0.005 for r in rows)  # the engine thread's CPU seconds, within its wall time
    assert all(r[7] >= 0 and r[8] >= 0 for r in rows)  # page faults, preemptions
    assert len(lines[0].split("\t")) == 1 + len(lines[1].split("\t"))  # "# pid N", then a name a column


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names and /proc are Linux's")
def test_the_engine_thread_is_named_and_its_cpu_is_counted_under_that_name(llama_dir: Path) -> None:
    engine = _engine(llama_dir)

    async def main() -> None:
        async_engine = AsyncLLMEngine(engine)
        before = cpu.snapshot()
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, output_kind="final_only")
        for i in range(3):
            async for _ in async_engine.generate(list(range(5, 105)), params, request_id=f"r{i}"):
                pass
        spent = cpu.spent(before, cpu.snapshot())
        assert spent["client"].get("pdmesh-engine", 0.0) > 0.0, spent
        server, client = cpu.totals(spent)
        assert server == 0.0 and client >= spent["client"]["pdmesh-engine"]
        assert any(line.strip().startswith("client") for line in cpu.lines(spent))
        await async_engine.shutdown()

    asyncio.run(main())
