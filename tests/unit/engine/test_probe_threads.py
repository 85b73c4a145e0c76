"""A worker that borrows idle peers' cores measures its linear plan on all of them (where
a lone prompt computes), then runs on its own share."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest
import torch

from pdmesh.config import CacheConfig
from pdmesh.engine.llm_engine import LLMEngine
from services.worker.config import WorkerConfig


def test_only_a_worker_that_borrows_cores_probes_beyond_its_share(llama_dir: Path) -> None:
    lending = WorkerConfig(model=str(llama_dir), role="prefill", threads=1, core_share="/tmp/cores:0").engine_config()
    fixed = WorkerConfig(model=str(llama_dir), role="prefill", threads=1).engine_config()
    assert (lending.num_threads, lending.probe_threads) == (1, os.cpu_count())
    assert (fixed.num_threads, fixed.probe_threads) == (1, None)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to probe on more than one thread")
def test_the_engine_probes_on_probe_threads_then_runs_on_its_own(llama_dir: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    config = WorkerConfig(model=str(llama_dir), role="prefill", threads=1, core_share="/tmp/cores:0").engine_config()
    saved = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="pdmesh.model.linear_plan"):
            LLMEngine(dataclasses.replace(config, dtype="float32", cache=CacheConfig(num_blocks=64)))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)
    plans = [r.getMessage() for r in caplog.records if "linear products" in r.getMessage()]
    assert plans and plans[0].startswith(f"linear products on {os.cpu_count()} thread(s)")
