"""The benchmark's table, JSON and PNG plots (latency CDFs; throughput and goodput vs rate)."""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pdmesh.bench.serve.paired import Paired, paired
from pdmesh.bench.serve.targets import Record

COLUMNS = [("output_tok_s", "out tok/s", "{:.1f}"), ("request_s", "req/s", "{:.2f}"),
           ("goodput_request_s", "goodput", "{:.2f}"), ("ttft_p50_ms", "TTFT p50", "{:.0f}"),
           ("ttft_p90_ms", "p90", "{:.0f}"), ("ttft_p99_ms", "p99", "{:.0f}"),
           ("tpot_p50_ms", "TPOT p50", "{:.1f}"), ("tpot_p90_ms", "p90", "{:.1f}"),
           ("itl_p99_ms", "ITL p99", "{:.0f}"), ("e2e_p50_ms", "E2E p50", "{:.0f}"),
           ("cached_token_ratio", "cached", "{:.2f}"), ("server_cpu_s", "srv CPU s", "{:.1f}"),
           ("failed", "failed", "{:.0f}")]


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'target':<34} {'rate':>6} " + " ".join(f"{label:>9}" for _, label, _ in COLUMNS)
    lines = [head]
    for r in rows:
        rate = "inf" if r["rate"] == float("inf") else f"{r['rate']:g}"
        cells = " ".join(f"{fmt.format(r[key]):>9}" for key, _, fmt in COLUMNS)
        lines.append(f"{r['target'][:34]:<34} {rate:>6} {cells}")
    return "\n".join(lines)


RATIO_KEYS = (("output_tok_s", "tok/s"), ("ttft_p50_ms", "TTFT p50"), ("tpot_p50_ms", "TPOT p50"))
"""The figures a comparison reports as ratios: throughput and the two latencies users feel."""


def ratios(rows: list[dict[str, Any]], a: str, b: str) -> list[str]:
    """``b / a`` (the ``compare`` side over the ``target`` side) per rate: the ratio of
    the means over rounds, then, with several rounds, each figure's rounds as pairs."""
    out = []
    for rate, figures in paired_by_rate(rows).items():
        parts = [f"{label} {_mean(rows, 'compare', rate, key) / _mean(rows, 'target', rate, key):.2f}x"
                 for key, label in RATIO_KEYS]
        out.append(f"rate {rate:g}: {b} / {a}: " + ", ".join(parts))
        out += [f"  {label}, rounds as pairs: {figures[key].describe()}" for key, label in RATIO_KEYS
                if key in figures and len(figures[key].ratios) > 1]
    return out


def side_values(rows: list[dict[str, Any]], side: str, rate: float, key: str) -> list[float]:
    """``key`` of one side's runs at ``rate``, in round order (a pair's two halves line up)."""
    return [r[key] for r in sorted(rows, key=lambda r: r["round"]) if r["side"] == side and r["rate"] == rate]


def _mean(rows: list[dict[str, Any]], side: str, rate: float, key: str) -> float:
    vals = side_values(rows, side, rate, key)
    return sum(vals) / len(vals) if vals else float("nan")


def paired_by_rate(rows: list[dict[str, Any]]) -> dict[float, dict[str, Paired]]:
    """Per rate, each ``RATIO_KEYS`` figure's rounds as ``compare / target`` pairs; a
    figure some round lacks (every request failed: NaN or 0) gets none rather than a
    ratio of nothing."""
    out: dict[float, dict[str, Paired]] = {}
    for rate in sorted({r["rate"] for r in rows}):
        out[rate] = {}
        for key, _ in RATIO_KEYS:
            a, b = side_values(rows, "target", rate, key), side_values(rows, "compare", rate, key)
            if a and len(a) == len(b) and all(math.isfinite(v) and v > 0 for v in a + b):
                out[rate][key] = paired(a, b)
    return out


def write(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]],
          records: dict[str, list[Record]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    pairs = {f"{rate:g}": {key: asdict(p) for key, p in figures.items()}  # empty without --compare
             for rate, figures in paired_by_rate(rows).items()}
    report = meta | {"machine": platform.machine(), "rows": rows, "paired": pairs}
    (out / "serve.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return [out / "serve.json", *_plots(out, rows, records)]


def _plots(out: Path, rows: list[dict[str, Any]], records: dict[str, list[Record]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, recs in records.items():
        ok = [r for r in recs if r.ok]
        for ax, values in zip(axes, (
            [1000 * (r.first - r.start) for r in ok if r.first is not None],
            [1000 * (r.end - r.first) / (r.output_tokens - 1) for r in ok
             if r.first is not None and r.end is not None and r.output_tokens > 1],
            [1000 * (r.end - r.start) for r in ok if r.end is not None],
        )):
            s = sorted(values)
            ax.plot(s, [(i + 1) / len(s) for i in range(len(s))], label=name)
    for ax, title in zip(axes, ("TTFT (ms)", "TPOT (ms)", "end to end (ms)")):
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    cdf = out / "latency_cdf.png"
    fig.savefig(cdf, dpi=110)
    plt.close(fig)
    paths = [cdf]
    finite = [r for r in rows if r["rate"] != float("inf")]
    if len({r["rate"] for r in finite}) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for target in sorted({r["target"] for r in finite}):
            pts = sorted((r["rate"], r["output_tok_s"], r["goodput_request_s"])
                         for r in finite if r["target"] == target)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{target} tok/s")
            ax.plot([p[0] for p in pts], [p[2] * 100 for p in pts], marker="x", ls="--",
                    label=f"{target} goodput x100 req/s")
        ax.set_xlabel("request rate (req/s)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        sweep = out / "throughput_vs_rate.png"
        fig.savefig(sweep, dpi=110)
        plt.close(fig)
        paths.append(sweep)
    return paths
