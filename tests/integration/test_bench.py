import argparse
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def run_bench(out: Path, *args: str, timeout: float = 300) -> tuple[str, dict]:  # type: ignore[type-arg]
    """``pdmesh bench ARGS --out OUT`` in a child process: its table and its JSON report."""
    proc = subprocess.run([sys.executable, "-m", "pdmesh", "bench", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_bench_engine_quick_writes_table_and_json(llama_dir: Path, tmp_path: Path) -> None:
    table, data = run_bench(tmp_path / "engine.json", "engine", "--model", str(llama_dir), "--quick",
                            "--dtype", "float32", "--num-blocks", "512")
    assert "decode batch 8 (best of 3)" in table
    metrics = {(r["workload"], r["metric"]) for r in data["rows"]}
    assert ("decode batch 1 (best of 3)", "tok/s") in metrics
    assert all(r["pdmesh"] > 0 for r in data["rows"])


def test_bench_tracing_reports_off_and_on(tmp_path: Path) -> None:
    _, data = run_bench(tmp_path / "tracing.json", "tracing", "--requests", "300", timeout=120)
    assert 0 < data["off_us_per_request"] < data["on_us_per_request"]


def test_bench_structured_pairs_free_and_constrained_rounds(llama_dir: Path, tmp_path: Path) -> None:
    table, rows = run_bench(tmp_path / "structured.json", "structured", "--model", str(llama_dir), "--requests", "4",
                            "--items", "4", "--rounds", "3")
    assert [r["constrained_share"] for r in rows] == [0.0, 0.5, 1.0]
    assert all(len(r["tok_s_free"]) == len(r["tok_s_grammar"]) == 3 and r["ratio_low"] <= r["ratio_tok_s"]
               <= r["ratio_high"] for r in rows)
    assert "free_rows_speed" in rows[1] and "the free rows' speed" in table


def test_bench_mesh_refuses_a_section_it_does_not_have() -> None:
    from pdmesh.bench.mesh import run_mesh_bench

    with pytest.raises(SystemExit, match="no section kvx; the sections are engine, kv, routing, index"):
        run_mesh_bench(argparse.Namespace(model="unused", dtype="float32", quick=True, sections=["kv", "kvx"], threads=0))


def test_bench_mesh_quick_runs_the_engine_and_kv_sections(llama_dir: Path, tmp_path: Path) -> None:
    table, data = run_bench(tmp_path / "mesh.json", "mesh", "--model", str(llama_dir), "--quick",
                            "--sections", "engine,kv", "--threads", "1", "--lone-tokens", "3", timeout=600)
    rows = {r["metric"]: r for r in data["rows"]}
    lone = rows["TTFT p50 added vs one worker (64-token prompts, 3 token(s) out, one at a time, 4 each way) (ms)"]
    assert lone["note"].startswith("mesh ") and " / one worker " in lone["note"] and " / in process " in lone["note"]
    assert "TTFT p50 added vs in process, 1 thread(s) (ms)" in rows
    beyond = rows["TTFT p50 beyond the forward pass, added vs one worker (ms)"]  # every forward matched
    assert beyond["note"].startswith("TTFT - forward: mesh ")
    for side in ("before", "after"):  # the time beyond the forward, split at it
        assert rows[f"TTFT p50 {side} the forward pass, added vs one worker (ms)"]["note"].startswith(f"{side} the forward: mesh ")
    assert rows["output tok/s (8 x 64 in + 8 out, all at once)"]["value"] > 0
    assert rows["mesh KV write GiB/s (writes of ~4 blocks, under load)"]["value"] > 0
    if platform.machine() in ("x86_64", "AMD64") and (shutil.which("cc") or shutil.which("gcc")):
        for metric in ("mesh KV write GiB/s vs plain stores, fresh blocks",
                       "plain stores GiB/s, source in cache, fresh destination",
                       "non-temporal stores GiB/s, fresh blocks"):
            assert rows[metric]["value"] > 0 and rows[metric]["baseline"] > 0
    else:  # a host that cannot build the copies says so
        assert "one-core copies not measured: " in table
