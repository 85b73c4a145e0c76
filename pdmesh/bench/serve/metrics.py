"""Client-side figures from request records: throughput, TTFT / TPOT / ITL / E2E
percentiles, goodput under SLOs."""

from __future__ import annotations

from dataclasses import dataclass

from pdmesh.bench.serve.targets import Record
from pdmesh.bench.stats import pct


@dataclass(frozen=True)
class SLO:
    ttft_s: float = 2.0
    tpot_s: float = 0.2


def summarize(records: list[Record], seconds: float, slo: SLO) -> dict[str, float]:
    ok = [r for r in records if r.ok]
    ttft = [r.first - r.start for r in ok if r.first is not None]
    e2e = [r.end - r.start for r in ok if r.end is not None]
    tpot = [(r.end - r.first) / (r.output_tokens - 1) for r in ok
            if r.first is not None and r.end is not None and r.output_tokens > 1]
    itl = [b - a for r in ok for a, b in zip(r.chunks, r.chunks[1:])]
    good = [r for r in ok if r.first is not None and r.first - r.start <= slo.ttft_s and (
        r.output_tokens <= 1 or (r.end - r.first) / (r.output_tokens - 1) <= slo.tpot_s)]  # type: ignore[operator]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    row = {
        "requests": float(len(records)), "completed": float(len(ok)), "failed": float(len(records) - len(ok)),
        "seconds": seconds, "output_tok_s": out_tokens / seconds if seconds else 0.0,
        "request_s": len(ok) / seconds if seconds else 0.0,
        "goodput_request_s": len(good) / seconds if seconds else 0.0,
        "cached_token_ratio": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for q in (0.5, 0.9, 0.99):
            row[f"{name}_p{int(q * 100)}_ms"] = 1000 * pct(values, q)
    return row
