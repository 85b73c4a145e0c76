"""``pdmesh bench serve`` against a live mesh over gRPC and HTTP at once: it writes its table,
JSON and plots with numbers that add up."""

from __future__ import annotations

import json
from pathlib import Path

from pdmesh.cli import build_parser
from pdmesh.launcher import Mesh


def test_bench_serve_compares_grpc_and_http_on_a_live_mesh(mesh: Mesh, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "serve"
    args = build_parser().parse_args([
        "bench", "serve", "--target", f"grpc://{mesh.router_address}", "--compare", mesh.http_url,
        "--model", mesh.spec.model, "--workload", "chat", "--num-requests", "6", "--turns", "2",
        "--input-len", "24", "--output-len", "4", "--rate", "10", "40", "--no-progress", "--out", str(out),
    ])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "out tok/s" in printed and "/ grpc://" in printed  # the table and the ratio line
    report = json.loads((out / "serve.json").read_text())
    assert len(report["rows"]) == 4  # 2 targets x 2 rates
    assert {r["side"] for r in report["rows"]} == {"target", "compare"}
    for rate in ("10", "40"):  # one round: one pair per rate, no interval
        tok_s = report["paired"][rate]["output_tok_s"]
        assert len(tok_s["ratios"]) == 1 and tok_s["low"] != tok_s["low"]  # NaN
    for row in report["rows"]:
        assert row["requests"] == row["completed"] == 6 and row["failed"] == 0
        assert 0 < row["ttft_p50_ms"] <= row["e2e_p50_ms"]
        assert row["output_tok_s"] > 0
    # Later turns of a session resend the conversation: the prefix cache must show it.
    assert max(r["cached_token_ratio"] for r in report["rows"]) > 0
    assert (out / "latency_cdf.png").stat().st_size > 10_000
    assert (out / "throughput_vs_rate.png").stat().st_size > 10_000
