"""Rows, table, JSON and plots of the routing benchmarks (simulated and real mesh).

Both report the same figures per policy and load: prompt tokens computed (the real cost)
against the oracle's, hit rate by source (own prefix cache, kvstore, none), TTFT p50 / p90 /
p99, goodput under a TTFT objective, and load imbalance (busiest worker's computed tokens /
mean); the simulator adds decision latency and Redis figures.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from pdmesh.bench.stats import pct

COLUMNS = [("workers", "workers", "{:.0f}"), ("load", "load", "{:.1f}"),
           ("computed_vs_oracle", "computed/oracle", "{:.2f}"), ("hit_own", "hit own", "{:.3f}"),
           ("hit_kvstore", "kvstore", "{:.3f}"), ("hit_vs_oracle", "hit/oracle", "{:.2f}"),
           ("ttft_p50_ms", "TTFT p50", "{:.0f}"), ("ttft_p90_ms", "p90", "{:.0f}"),
           ("ttft_p99_ms", "p99", "{:.0f}"), ("goodput_rps", "goodput/s", "{:.1f}"),
           ("slo_met", "SLO met", "{:.2f}"), ("imbalance", "imbalance", "{:.2f}"),
           ("decision_p50_ms", "decide p50", "{:.2f}"), ("decision_p99_ms", "p99", "{:.2f}")]


def summarize(policy: str, workers: int, load: float, ttfts: list[float], prompt: int, own: int,
              kvstore: int, oracle_computed: int, per_worker: list[int], duration_s: float,
              slo_s: float, decisions: list[float] | None = None, **extra: Any) -> dict[str, Any]:
    """One row. ``own`` / ``kvstore``: prompt tokens served from each source; the rest was
    computed. ``per_worker``: prompt tokens each worker computed."""
    computed = prompt - own - kvstore
    oracle_hit = 1 - oracle_computed / prompt
    met = sum(t <= slo_s for t in ttfts)
    mean = sum(per_worker) / len(per_worker) if per_worker else 0
    return {
        "policy": policy, "workers": workers, "load": load, "requests": len(ttfts),
        "prompt_tokens": prompt, "computed_tokens": computed, "oracle_computed_tokens": oracle_computed,
        "computed_vs_oracle": computed / oracle_computed if oracle_computed else float("nan"),
        "hit_own": own / prompt, "hit_kvstore": kvstore / prompt, "hit_oracle": oracle_hit,
        "hit_vs_oracle": (own + kvstore) / prompt / oracle_hit if oracle_hit > 0 else float("nan"),
        "ttft_p50_ms": 1000 * pct(ttfts, 0.5), "ttft_p90_ms": 1000 * pct(ttfts, 0.9),
        "ttft_p99_ms": 1000 * pct(ttfts, 0.99), "slo_ms": 1000 * slo_s,
        "slo_met": met / len(ttfts) if ttfts else float("nan"),
        "goodput_rps": met / duration_s if duration_s else float("nan"),
        "imbalance": max(per_worker) / mean if mean else float("nan"),
        "decision_p50_ms": 1000 * pct(decisions, 0.5) if decisions else float("nan"),
        "decision_p99_ms": 1000 * pct(decisions, 0.99) if decisions else float("nan"),
        **extra,
    }


def table(rows: list[dict[str, Any]]) -> str:
    width = max([13, *(len(r["policy"]) for r in rows)])
    lines = [f"{'policy':<{width}} " + " ".join(f"{label:>10}" for _, label, _ in COLUMNS)]
    for r in rows:
        lines.append(f"{r['policy']:<{width}} " + " ".join(f"{fmt.format(r[k]):>10}" for k, _, fmt in COLUMNS))
    return "\n".join(lines)


def versus(rows: list[dict[str, Any]], policy: str = "cache_aware") -> list[str]:
    """How ``policy`` compares with each other policy at each (workers, load, seed)."""
    out = []
    for r in rows:
        if r["policy"] != policy:
            continue
        for o in rows:
            if o["policy"] != policy and (o["workers"], o["load"], o.get("seed")) == (
                    r["workers"], r["load"], r.get("seed")):
                seed = f", seed {r['seed']}" if "seed" in r else ""
                out.append(f"{r['workers']} workers, load {r['load']:.1f}{seed}: {o['policy']} / {policy} "
                           f"TTFT p90 {o['ttft_p90_ms'] / r['ttft_p90_ms']:.2f}x, p50 "
                           f"{o['ttft_p50_ms'] / r['ttft_p50_ms']:.2f}x, computed tokens "
                           f"{o['computed_tokens'] / r['computed_tokens']:.2f}x")
    return out


def write(rows: list[dict[str, Any]], out: Path, meta: dict[str, Any],
          cdfs: dict[str, list[float]] | None = None) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "processor": platform.processor(),
                               **meta, "rows": rows}, indent=2))
    return _plots(rows, out, cdfs or {})


def _plots(rows: list[dict[str, Any]], out: Path, cdfs: dict[str, list[float]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        x = [f"{r['workers']}w/{r['load']:.1f}" for r in mine]
        axes[0].plot(x, [r["ttft_p90_ms"] for r in mine], marker="o", label=policy)
        axes[1].plot(x, [r["computed_vs_oracle"] for r in mine], marker="o", label=policy)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("TTFT p90 (ms)")
    axes[1].set_ylabel("prompt tokens computed / oracle")
    for ax in axes:
        ax.set_xlabel("workers / load")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    if cdfs:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, values in cdfs.items():
            ordered = sorted(values)
            ax.plot([1000 * v for v in ordered], [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out.with_name(out.stem + "-ttft-cdf.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
