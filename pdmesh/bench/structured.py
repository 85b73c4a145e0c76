"""``pdmesh bench structured``: what a grammar costs a batch. 32 concurrent requests in one
engine, with 0 %, 50 % and 100 % of them under a JSON schema, each against the same load
unconstrained; output tokens per second and TPOT, the constrained and free rows of the
mixed batch apart.

Both loads produce the same number of tokens per request: the schema is a list of exactly
``--items`` digits, so its output has a fixed length, and an unconstrained request runs to
that many tokens (``ignore_eos``, ``max_tokens`` as the constrained run measured). Each
round runs both loads back to back (order swapped every round) and gives a ratio; the
geometric mean of the rounds' ratios and its 95% interval are the result (the machine
drifts more between minutes than the margins asked about; ``bench/serve/paired.py``).
docs/structured-outputs.md keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pdmesh.bench import BENCH_DTYPE_HELP
from pdmesh.bench.serve.paired import paired
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams
from pdmesh.structured.spec import StructuredOutput


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder (required)")
    p.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    p.add_argument("--requests", type=int, default=32, help="concurrent requests (default: %(default)s)")
    p.add_argument("--items", type=int, default=48, help="digits in the schema's list (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="torch threads, 0 = default (default: 0)")
    p.add_argument("--rounds", type=int, default=6,
                   help="paired rounds, free and constrained in turn (default: %(default)s)")
    p.add_argument("--out", default="bench-results/structured.json", help="JSON report (default: %(default)s)")


def _schema(items: int) -> StructuredOutput:
    return StructuredOutput.of_schema({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                       "minItems": items, "maxItems": items})


def _run(engine: LLMEngine, params: list[SamplingParams], tag: str) -> dict[int, tuple[int, float, float]]:
    """Per request: (tokens, first-token time, finish time), all admitted at once."""
    start = time.perf_counter()
    for i, p in enumerate(params):
        engine.add_request(f"{tag}-{i}", [0, *range(40 + i, 56 + i)], p)
    first: dict[int, float] = {}
    done: dict[int, tuple[int, float, float]] = {}
    counts: dict[int, int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            i = int(out.request_id.rsplit("-", 1)[1])
            counts[i] = counts.get(i, 0) + len(out.outputs[0].token_ids)
            first.setdefault(i, time.perf_counter() - start)
            if out.finished:
                done[i] = (counts[i], first[i], time.perf_counter() - start)
    return done


def _figures(done: dict[int, tuple[int, float, float]], rows: list[int]) -> dict[str, float]:
    """Tokens, tokens per second (to the last of ``rows`` to finish) and median TPOT of ``rows``."""
    picked = [done[i] for i in rows]
    tokens = sum(t for t, _, _ in picked)
    wall = max(end for _, _, end in picked)
    tpot = sorted((end - first) / max(1, t - 1) for t, first, end in picked)
    return {"tokens": tokens, "tok_s": tokens / wall, "tpot_ms_p50": 1000 * tpot[len(tpot) // 2]}


def run_structured_bench(args: argparse.Namespace) -> list[dict]:
    engine = LLMEngine.from_model(args.model, dtype=args.dtype, threads=args.threads,
                                  max_num_seqs=max(64, args.requests))
    spec, n = _schema(args.items), args.requests
    probe = _run(engine, [SamplingParams(temperature=0, max_tokens=4 * args.items, structured_output=spec,
                                          output_kind="delta")], "probe")
    length = probe[0][0]  # the schema's output, EOS included: every request produces this many
    rows = []
    for share in (0.0, 0.5, 1.0):
        constrained = set(range(0, n, 2)) if share == 0.5 else set(range(n)) if share == 1.0 else set()
        loose = [i for i in range(n) if i not in constrained]
        with_grammar = [SamplingParams(temperature=0.8, seed=i, max_tokens=length, ignore_eos=i not in constrained,
                                       output_kind="delta", structured_output=spec if i in constrained else None)
                        for i in range(n)]
        free = [SamplingParams(temperature=0.8, seed=i, max_tokens=length, ignore_eos=True, output_kind="delta")
                for i in range(n)]
        runs: dict[str, list[dict[str, float]]] = {"free": [], "grammar": [], "free_rows": [], "free_rows_mixed": []}
        for r in range(args.rounds):  # pairs, the order swapped every round
            order = (("free", free), ("grammar", with_grammar))
            for name, params in order if r % 2 == 0 else order[::-1]:
                done = _run(engine, params, f"{name}{r}-{share}")
                runs[name].append(_figures(done, list(range(n))))
                if loose:
                    runs["free_rows" if name == "free" else "free_rows_mixed"].append(_figures(done, loose))
        tok_s = paired([f["tok_s"] for f in runs["free"]], [f["tok_s"] for f in runs["grammar"]])
        row = {"constrained_share": share, "requests": n, "tokens_per_request": length, "rounds": args.rounds,
               "tok_s_free": [f["tok_s"] for f in runs["free"]], "tok_s_grammar": [f["tok_s"] for f in runs["grammar"]],
               "tpot_ms_free": [f["tpot_ms_p50"] for f in runs["free"]],
               "tpot_ms_grammar": [f["tpot_ms_p50"] for f in runs["grammar"]],
               "ratio_tok_s": tok_s.geomean, "ratio_low": tok_s.low, "ratio_high": tok_s.high}
        line = f"{int(100 * share):>3}% constrained: tok/s with grammar / free {tok_s.describe()}"
        if share == 0.5:  # the free rows' speed: their TPOT alone, over their TPOT beside constrained ones
            free_rows = paired([f["tpot_ms_p50"] for f in runs["free_rows_mixed"]],
                               [f["tpot_ms_p50"] for f in runs["free_rows"]])
            row |= {"free_rows_speed": free_rows.geomean, "free_rows_low": free_rows.low,
                    "free_rows_high": free_rows.high}
            line += f"\n     the free rows' speed beside constrained ones: {free_rows.describe()}"
        rows.append(row)
        print(line, flush=True)
    assert engine.stats().used == 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.out}")
    return rows
